// The node-local DNS address's interface over rtnetlink (libmnl): requests as bytes, then one
// request at a time on a NETLINK_ROUTE socket, each acknowledged.
#include "proxy/node_local_address.h"

#include <errno.h>
#include <libmnl/libmnl.h>
#include <linux/if_addr.h>
#include <linux/if_link.h>
#include <linux/rtnetlink.h>
#include <net/if.h>
#include <sys/socket.h>

#include <cstring>
#include <memory>
#include <vector>

namespace endpointd::proxy {
namespace {

constexpr size_t kRequestSize = 256;

// A request's bytes: header, family header, attributes, cut to the length the header says.
class Request {
 public:
  Request(uint16_t type, uint16_t flags, uint32_t seq) : buf_(kRequestSize, '\0') {
    nlh_ = mnl_nlmsg_put_header(buf_.data());
    nlh_->nlmsg_type = type;
    nlh_->nlmsg_flags = static_cast<uint16_t>(NLM_F_REQUEST | NLM_F_ACK | flags);
    nlh_->nlmsg_seq = seq;
  }
  template <typename T>
  T* extra() {
    return static_cast<T*>(mnl_nlmsg_put_extra_header(nlh_, sizeof(T)));
  }
  nlmsghdr* nlh() { return nlh_; }
  std::string bytes() && {
    buf_.resize(nlh_->nlmsg_len);
    return std::move(buf_);
  }

 private:
  std::string buf_;
  nlmsghdr* nlh_;
};

std::string link_request(uint16_t type, uint16_t flags, std::string_view name, bool dummy_up,
                         uint32_t seq) {
  Request r(type, flags, seq);
  auto* ifi = r.extra<ifinfomsg>();
  ifi->ifi_family = AF_UNSPEC;
  if (dummy_up) {
    ifi->ifi_change = IFF_UP;
    ifi->ifi_flags = IFF_UP;
  }
  std::string n(name.substr(0, IFNAMSIZ - 1));
  mnl_attr_put_strz(r.nlh(), IFLA_IFNAME, n.c_str());
  if (dummy_up) {
    nlattr* info = mnl_attr_nest_start(r.nlh(), IFLA_LINKINFO);
    mnl_attr_put_strz(r.nlh(), IFLA_INFO_KIND, "dummy");
    mnl_attr_nest_end(r.nlh(), info);
  }
  return std::move(r).bytes();
}

std::string address_request(uint16_t type, uint16_t flags, uint32_t ifindex, const model::IpAddr& a,
                            uint32_t seq) {
  Request r(type, flags, seq);
  auto* ifa = r.extra<ifaddrmsg>();
  ifa->ifa_family = a.is_v4() ? AF_INET : AF_INET6;
  ifa->ifa_prefixlen = a.is_v4() ? 32 : 128;
  ifa->ifa_scope = RT_SCOPE_UNIVERSE;
  ifa->ifa_index = ifindex;
  if (a.is_v6()) ifa->ifa_flags = IFA_F_NODAD;
  auto len = static_cast<uint16_t>(a.size());
  mnl_attr_put(r.nlh(), IFA_LOCAL, len, a.data());
  mnl_attr_put(r.nlh(), IFA_ADDRESS, len, a.data());
  return std::move(r).bytes();
}

struct CloseSocket {
  void operator()(mnl_socket* s) const { mnl_socket_close(s); }
};
using Socket = std::unique_ptr<mnl_socket, CloseSocket>;

Result<Socket> open_route_socket() {
  Socket s(mnl_socket_open(NETLINK_ROUTE));
  if (!s) return Error{std::string("rtnetlink socket: ") + std::strerror(errno)};
  if (mnl_socket_bind(s.get(), 0, MNL_SOCKET_AUTOPID) < 0)
    return Error{std::string("rtnetlink bind: ") + std::strerror(errno)};
  return s;
}

// Sends one request and reads its acknowledgement: 0, or the errno the kernel answered.
int send_request(mnl_socket* s, const std::string& req, uint32_t seq) {
  if (mnl_socket_sendto(s, req.data(), req.size()) < 0) return errno;
  std::vector<char> buf(MNL_SOCKET_BUFFER_SIZE);
  uint32_t port = mnl_socket_get_portid(s);
  for (;;) {
    ssize_t n = mnl_socket_recvfrom(s, buf.data(), buf.size());
    if (n < 0) return errno;
    int rc = mnl_cb_run(buf.data(), static_cast<size_t>(n), seq, port, nullptr, nullptr);
    if (rc < 0) return errno;
    if (rc == MNL_CB_STOP) return 0;
  }
}

std::string what_failed(const std::string& what, const std::string& on, int err) {
  return what + " " + on + ": " + std::strerror(err);
}

}  // namespace

std::string new_dummy_link_request(std::string_view name, uint32_t seq) {
  return link_request(RTM_NEWLINK, NLM_F_CREATE, name, true, seq);
}

std::string del_link_request(std::string_view name, uint32_t seq) {
  return link_request(RTM_DELLINK, 0, name, false, seq);
}

std::string new_address_request(uint32_t ifindex, const model::IpAddr& a, uint32_t seq) {
  return address_request(RTM_NEWADDR, NLM_F_CREATE | NLM_F_REPLACE, ifindex, a, seq);
}

std::string del_address_request(uint32_t ifindex, const model::IpAddr& a, uint32_t seq) {
  return address_request(RTM_DELADDR, 0, ifindex, a, seq);
}

Result<std::string> ensure_node_local_address(const model::IpAddr& a) {
  auto s = open_route_socket();
  if (!s) return Error{s.error()};
  uint32_t seq = 1;
  std::string where = kNodeLocalInterface;
  int err = send_request(s->get(), new_dummy_link_request(where, seq), seq);
  ++seq;
  // Without the dummy driver the kernel knows no such link kind: the address goes on lo.
  if (err == EOPNOTSUPP)
    where = "lo";
  else if (err != 0)
    return Error{what_failed("cannot make dummy interface", where, err)};
  unsigned index = if_nametoindex(where.c_str());
  if (index == 0) return Error{what_failed("no interface", where, errno)};
  err = send_request(s->get(), new_address_request(index, a, seq), seq);
  if (err != 0) return Error{what_failed("cannot add address " + a.str() + " to", where, err)};
  return where;
}

Status remove_node_local_address(const model::IpAddr& a) {
  auto s = open_route_socket();
  if (!s) return Error{s.error()};
  int err = send_request(s->get(), del_link_request(kNodeLocalInterface, 1), 1);
  if (err != 0 && err != ENODEV)
    return Error{what_failed("cannot delete interface", kNodeLocalInterface, err)};
  unsigned lo = if_nametoindex("lo");
  if (lo == 0) return {};
  err = send_request(s->get(), del_address_request(lo, a, 2), 2);
  if (err != 0 && err != EADDRNOTAVAIL)
    return Error{what_failed("cannot delete address " + a.str() + " from", "lo", err)};
  return {};
}

}  // namespace endpointd::proxy
