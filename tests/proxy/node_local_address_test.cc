// The node-local DNS address's rtnetlink requests, decoded back with libmnl (no root): a dummy
// link that is up, the address as a host route's worth (/32, /128), and their deletions.
#include "proxy/node_local_address.h"

#include <gtest/gtest.h>
#include <libmnl/libmnl.h>
#include <linux/if_addr.h>
#include <linux/if_link.h>
#include <linux/rtnetlink.h>
#include <net/if.h>
#include <sys/socket.h>

#include <cstring>
#include <map>
#include <string>

#include "tests/proxy/nl_walk.h"

namespace endpointd::proxy {
namespace {

using testing::each_attr;

struct Decoded {
  uint16_t type = 0;
  uint16_t flags = 0;
  uint32_t seq = 0;
  std::string family_header;              // ifinfomsg or ifaddrmsg, as bytes
  std::map<uint16_t, std::string> attrs;  // top-level attributes' payloads
  std::string kind;                       // IFLA_LINKINFO / IFLA_INFO_KIND
};

Decoded decode(const std::string& bytes, size_t header_size) {
  Decoded d;
  nlmsghdr h{};
  EXPECT_GE(bytes.size(), sizeof h);
  std::memcpy(&h, bytes.data(), sizeof h);
  EXPECT_EQ(h.nlmsg_len, bytes.size()) << "one message, nothing after it";
  d.type = h.nlmsg_type;
  d.flags = h.nlmsg_flags;
  d.seq = h.nlmsg_seq;
  const char* body = bytes.data() + MNL_NLMSG_HDRLEN;
  d.family_header.assign(body, header_size);
  size_t attrs_at = MNL_NLMSG_HDRLEN + MNL_ALIGN(header_size);
  each_attr(bytes.data() + attrs_at, bytes.size() - attrs_at, [&](const nlattr* a) {
    d.attrs[mnl_attr_get_type(a)] =
        std::string(static_cast<const char*>(mnl_attr_get_payload(a)), mnl_attr_get_payload_len(a));
    if (mnl_attr_get_type(a) == IFLA_LINKINFO && header_size == sizeof(ifinfomsg)) {
      each_attr(mnl_attr_get_payload(a), mnl_attr_get_payload_len(a), [&](const nlattr* in) {
        if (mnl_attr_get_type(in) == IFLA_INFO_KIND) d.kind = mnl_attr_get_str(in);
      });
    }
  });
  return d;
}

TEST(NodeLocalAddress, DummyLinkRequestMakesItUpAndTakesAnExistingOne) {
  Decoded d = decode(new_dummy_link_request(kNodeLocalInterface, 7), sizeof(ifinfomsg));
  EXPECT_EQ(d.type, RTM_NEWLINK);
  EXPECT_EQ(d.seq, 7u);
  EXPECT_TRUE(d.flags & NLM_F_REQUEST);
  EXPECT_TRUE(d.flags & NLM_F_ACK);
  EXPECT_TRUE(d.flags & NLM_F_CREATE);
  EXPECT_FALSE(d.flags & NLM_F_EXCL) << "an interface left by an earlier run is no error";
  ifinfomsg ifi{};
  std::memcpy(&ifi, d.family_header.data(), sizeof ifi);
  EXPECT_EQ(ifi.ifi_flags & IFF_UP, static_cast<unsigned>(IFF_UP));
  EXPECT_EQ(ifi.ifi_change & IFF_UP, static_cast<unsigned>(IFF_UP));
  EXPECT_EQ(d.attrs[IFLA_IFNAME], std::string("endpointd-dns") + '\0');
  EXPECT_EQ(d.kind, "dummy");
}

TEST(NodeLocalAddress, AddressRequestIsAHostAddressReplacedIfThere) {
  auto v4 = *model::IpAddr::parse("169.254.20.10");
  Decoded d = decode(new_address_request(12, v4, 3), sizeof(ifaddrmsg));
  EXPECT_EQ(d.type, RTM_NEWADDR);
  EXPECT_TRUE(d.flags & NLM_F_CREATE);
  EXPECT_TRUE(d.flags & NLM_F_REPLACE);
  ifaddrmsg ifa{};
  std::memcpy(&ifa, d.family_header.data(), sizeof ifa);
  EXPECT_EQ(ifa.ifa_family, AF_INET);
  EXPECT_EQ(ifa.ifa_prefixlen, 32);
  EXPECT_EQ(ifa.ifa_index, 12u);
  EXPECT_EQ(d.attrs[IFA_LOCAL], std::string("\xa9\xfe\x14\x0a", 4));
  EXPECT_EQ(d.attrs[IFA_ADDRESS], std::string("\xa9\xfe\x14\x0a", 4));

  auto v6 = *model::IpAddr::parse("fd00::10");
  d = decode(new_address_request(4, v6, 3), sizeof(ifaddrmsg));
  std::memcpy(&ifa, d.family_header.data(), sizeof ifa);
  EXPECT_EQ(ifa.ifa_family, AF_INET6);
  EXPECT_EQ(ifa.ifa_prefixlen, 128);
  EXPECT_TRUE(ifa.ifa_flags & IFA_F_NODAD) << "usable at once: bind() fails on a tentative one";
  EXPECT_EQ(d.attrs[IFA_ADDRESS].size(), 16u);
}

TEST(NodeLocalAddress, DeletionsNameTheLinkAndTheAddress) {
  Decoded d = decode(del_link_request(kNodeLocalInterface, 2), sizeof(ifinfomsg));
  EXPECT_EQ(d.type, RTM_DELLINK);
  EXPECT_FALSE(d.flags & NLM_F_CREATE);
  EXPECT_EQ(d.attrs[IFLA_IFNAME], std::string("endpointd-dns") + '\0');
  EXPECT_EQ(d.attrs.count(IFLA_LINKINFO), 0u);
  d = decode(del_address_request(1, *model::IpAddr::parse("169.254.20.10"), 2), sizeof(ifaddrmsg));
  EXPECT_EQ(d.type, RTM_DELADDR);
  EXPECT_EQ(d.attrs[IFA_LOCAL], std::string("\xa9\xfe\x14\x0a", 4));
}

}  // namespace
}  // namespace endpointd::proxy
