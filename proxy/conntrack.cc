// Conntrack over libnl-nf: one dump per call, filtered here, deletions by the entry's tuple
// and id (so an entry that was replaced meanwhile is never hit).
#include "proxy/conntrack.h"

#include <linux/netfilter/nf_conntrack_tcp.h>
#include <netinet/in.h>
#include <netlink/netfilter/ct.h>
#include <netlink/netfilter/nfnl.h>
#include <netlink/netlink.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <functional>
#include <unordered_map>

namespace endpointd::proxy {
namespace {

struct SocketFree {
  void operator()(nl_sock* s) const { nl_socket_free(s); }
};
using SocketPtr = std::unique_ptr<nl_sock, SocketFree>;

struct CtPut {
  void operator()(nfnl_ct* ct) const { nfnl_ct_put(ct); }
};
using CtPtr = std::unique_ptr<nfnl_ct, CtPut>;

Result<SocketPtr> connect_ctnetlink() {
  SocketPtr sock(nl_socket_alloc());
  if (!sock) return Error{"conntrack: nl_socket_alloc failed"};
  int err = nfnl_connect(sock.get());
  if (err < 0) return Error{std::string("conntrack: nfnl_connect: ") + nl_geterror(err)};
  return sock;
}

std::optional<model::IpAddr> to_ip(const nl_addr* a) {
  if (a == nullptr) return std::nullopt;
  int family = nl_addr_get_family(a);
  unsigned len = nl_addr_get_len(a);
  // nl_addr_get_binary_addr takes a non-const pointer but does not modify.
  const void* bytes = nl_addr_get_binary_addr(const_cast<nl_addr*>(a));
  uint8_t buf[16];
  if (family == AF_INET && len == 4) {
    std::memcpy(buf, bytes, 4);
    return model::IpAddr::from_bytes(model::IpFamily::kV4, buf);
  }
  if (family == AF_INET6 && len == 16) {
    std::memcpy(buf, bytes, 16);
    return model::IpAddr::from_bytes(model::IpFamily::kV6, buf);
  }
  return std::nullopt;
}

std::optional<Flow> to_flow(const nfnl_ct* ct) {
  Flow f;
  f.l4proto = nfnl_ct_get_proto(ct);
  auto os = to_ip(nfnl_ct_get_src(ct, 0)), od = to_ip(nfnl_ct_get_dst(ct, 0));
  auto rs = to_ip(nfnl_ct_get_src(ct, 1)), rd = to_ip(nfnl_ct_get_dst(ct, 1));
  if (!os || !od || !rs || !rd) return std::nullopt;
  f.orig_src = *os;
  f.orig_dst = *od;
  f.reply_src = *rs;
  f.reply_dst = *rd;
  f.orig_src_port = nfnl_ct_get_src_port(ct, 0);
  f.orig_dst_port = nfnl_ct_get_dst_port(ct, 0);
  f.reply_src_port = nfnl_ct_get_src_port(ct, 1);
  f.reply_dst_port = nfnl_ct_get_dst_port(ct, 1);
  if (f.l4proto == IPPROTO_TCP && nfnl_ct_test_tcp_state(ct))
    f.tcp_state = nfnl_ct_get_tcp_state(ct);
  return f;
}

// One dump of the table; `keep` decides, per entry, whether its libnl object is kept (for a
// deletion afterwards). Every parsed entry is passed to `visit`.
struct DumpContext {
  std::function<bool(const Flow&)> keep;
  std::function<void(const Flow&)> visit;
  std::vector<CtPtr> kept;
  size_t unparsed = 0;
};

int on_entry(nl_msg* msg, void* arg) {
  auto* ctx = static_cast<DumpContext*>(arg);
  nfnl_ct* raw = nullptr;
  if (nfnlmsg_ct_parse(nlmsg_hdr(msg), &raw) < 0 || raw == nullptr) {
    ++ctx->unparsed;
    return NL_SKIP;
  }
  CtPtr ct(raw);
  std::optional<Flow> f = to_flow(ct.get());
  if (!f) {
    ++ctx->unparsed;
    return NL_OK;
  }
  if (ctx->visit) ctx->visit(*f);
  if (ctx->keep && ctx->keep(*f)) ctx->kept.push_back(std::move(ct));
  return NL_OK;
}

Result<bool> dump(nl_sock* sock, DumpContext& ctx) {
  int err = nl_socket_modify_cb(sock, NL_CB_VALID, NL_CB_CUSTOM, on_entry, &ctx);
  if (err < 0) return Error{std::string("conntrack: nl_socket_modify_cb: ") + nl_geterror(err)};
  // A dump that races with table changes is reported as interrupted; it is retried whole.
  for (int attempt = 0; attempt < 3; ++attempt) {
    ctx.kept.clear();
    ctx.unparsed = 0;
    err = nfnl_ct_dump_request(sock);
    if (err < 0) return Error{std::string("conntrack: dump request: ") + nl_geterror(err)};
    err = nl_recvmsgs_default(sock);
    if (err >= 0) return true;
    if (err != -NLE_DUMP_INTR) break;
  }
  return Error{std::string("conntrack: dump: ") + nl_geterror(err)};
}

class NetlinkConntrack final : public Conntrack {
 public:
  Result<std::vector<Flow>> list() override {
    auto sock = connect_ctnetlink();
    if (!sock) return Error{sock.error()};
    std::vector<Flow> flows;
    DumpContext ctx;
    ctx.visit = [&](const Flow& f) { flows.push_back(f); };
    auto r = dump(sock->get(), ctx);
    if (!r) return Error{r.error()};
    return flows;
  }

  Result<DeletedFlows> delete_flows(const std::vector<FlowMatch>& matches) override {
    if (matches.empty()) return DeletedFlows{};
    return delete_flows_if([&](const Flow& f) {
      return std::any_of(matches.begin(), matches.end(),
                         [&](const FlowMatch& m) { return m.matches(f); });
    });
  }

  Result<DeletedFlows> delete_flows_if(const std::function<bool(const Flow&)>& stale) override {
    auto sock = connect_ctnetlink();
    if (!sock) return Error{sock.error()};
    DumpContext ctx;
    ctx.keep = stale;
    auto r = dump(sock->get(), ctx);
    if (!r) return Error{r.error()};
    // Back to the default handler for the acknowledgements of the deletions.
    nl_socket_modify_cb(sock->get(), NL_CB_VALID, NL_CB_DEFAULT, nullptr, nullptr);
    DeletedFlows deleted;
    std::string first_error;
    for (const auto& ct : ctx.kept) {
      int err = nfnl_ct_del(sock->get(), ct.get(), 0);
      if (err >= 0) {
        deleted.count(nfnl_ct_get_family(ct.get()) == AF_INET6);
      } else if (err != -NLE_OBJ_NOTFOUND && first_error.empty()) {
        first_error = nl_geterror(err);
      }
    }
    if (!first_error.empty()) {
      return Error{"conntrack: delete failed after " + std::to_string(deleted.total()) +
                   " entries: " + first_error};
    }
    return deleted;
  }

  Result<FlowCount> count_flows_to(const model::IpAddr& endpoint) override {
    auto sock = connect_ctnetlink();
    if (!sock) return Error{sock.error()};
    FlowCount count;
    DumpContext ctx;
    ctx.visit = [&](const Flow& f) { count_flow(f, endpoint, count); };
    auto r = dump(sock->get(), ctx);
    if (!r) return Error{r.error()};
    return count;
  }

  Result<std::vector<FlowCount>> count_flows_to_each(
      const std::vector<model::IpAddr>& endpoints) override {
    std::vector<FlowCount> counts(endpoints.size());
    if (endpoints.empty()) return counts;
    std::unordered_map<model::IpAddr, size_t, model::IpAddrHash> index;
    for (size_t i = 0; i < endpoints.size(); ++i) index.emplace(endpoints[i], i);
    auto sock = connect_ctnetlink();
    if (!sock) return Error{sock.error()};
    DumpContext ctx;
    ctx.visit = [&](const Flow& f) {
      auto it = index.find(f.reply_src);
      if (it != index.end()) count_flow(f, f.reply_src, counts[it->second]);
    };
    auto r = dump(sock->get(), ctx);
    if (!r) return Error{r.error()};
    // A repeated address gets the same count as its first occurrence.
    for (size_t i = 0; i < endpoints.size(); ++i) counts[i] = counts[index.at(endpoints[i])];
    return counts;
  }
};

}  // namespace

uint8_t ip_protocol_number(model::Protocol p) {
  switch (p) {
    case model::Protocol::kTCP:
      return IPPROTO_TCP;
    case model::Protocol::kUDP:
      return IPPROTO_UDP;
    case model::Protocol::kSCTP:
      return IPPROTO_SCTP;
  }
  return 0;
}

bool FlowMatch::matches(const Flow& f) const {
  if (protocol && ip_protocol_number(*protocol) != f.l4proto) return false;
  if (orig_dst && *orig_dst != f.orig_dst) return false;
  if (orig_dst_port && *orig_dst_port != f.orig_dst_port) return false;
  if (reply_src && *reply_src != f.reply_src) return false;
  if (reply_src_port && *reply_src_port != f.reply_src_port) return false;
  return true;
}

FlowMatch udp_to_endpoint(const model::IpAddr& endpoint, std::optional<uint16_t> port) {
  FlowMatch m;
  m.protocol = model::Protocol::kUDP;
  m.reply_src = endpoint;
  m.reply_src_port = port;
  return m;
}

FlowMatch udp_to_service(const model::IpAddr& vip, uint16_t port) {
  FlowMatch m;
  m.protocol = model::Protocol::kUDP;
  m.orig_dst = vip;
  m.orig_dst_port = port;
  return m;
}

FlowMatch udp_to_node_port(uint16_t node_port) {
  FlowMatch m;
  m.protocol = model::Protocol::kUDP;
  m.orig_dst_port = node_port;
  return m;
}

void count_flow(const Flow& f, const model::IpAddr& endpoint, FlowCount& count) {
  if (f.reply_src != endpoint) return;
  switch (f.l4proto) {
    case IPPROTO_TCP:
      switch (f.tcp_state.value_or(TCP_CONNTRACK_NONE)) {
        case TCP_CONNTRACK_ESTABLISHED:
          ++count.tcp_established;
          break;
        case TCP_CONNTRACK_SYN_SENT:
        case TCP_CONNTRACK_SYN_RECV:
          ++count.tcp_opening;
          break;
        case TCP_CONNTRACK_FIN_WAIT:
        case TCP_CONNTRACK_CLOSE_WAIT:
        case TCP_CONNTRACK_LAST_ACK:
          ++count.tcp_closing;
          break;
        default:
          break;  // TIME_WAIT, CLOSE: the connection is over
      }
      break;
    case IPPROTO_UDP:
      ++count.udp;
      break;
    case IPPROTO_SCTP:
      ++count.sctp;
      break;
    default:
      break;
  }
}

std::unique_ptr<Conntrack> make_netlink_conntrack() {
  return std::make_unique<NetlinkConntrack>();
}

}  // namespace endpointd::proxy
