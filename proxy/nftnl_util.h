// libnftnl handles owned by unique_ptr, and the family numbers, shared by the batch encoder
// (proxy/nft_encode.cc) and the socket (proxy/netlink.cc). Internal to proxy/.
#pragma once

#include <libnftnl/chain.h>
#include <libnftnl/expr.h>
#include <libnftnl/gen.h>
#include <libnftnl/rule.h>
#include <libnftnl/set.h>
#include <libnftnl/table.h>
#include <linux/netfilter.h>

#include <memory>

#include "proxy/table.h"

namespace endpointd::proxy::nftnl {

struct TableFree {
  void operator()(nftnl_table* p) const { nftnl_table_free(p); }
};
struct ChainFree {
  void operator()(nftnl_chain* p) const { nftnl_chain_free(p); }
};
struct RuleFree {
  void operator()(nftnl_rule* p) const { nftnl_rule_free(p); }
};
struct SetFree {
  void operator()(nftnl_set* p) const { nftnl_set_free(p); }
};
struct ExprFree {
  void operator()(nftnl_expr* p) const { nftnl_expr_free(p); }
};
struct GenFree {
  void operator()(nftnl_gen* p) const { nftnl_gen_free(p); }
};
using TablePtr = std::unique_ptr<nftnl_table, TableFree>;
using ChainPtr = std::unique_ptr<nftnl_chain, ChainFree>;
using RulePtr = std::unique_ptr<nftnl_rule, RuleFree>;
using SetPtr = std::unique_ptr<nftnl_set, SetFree>;
using ExprPtr = std::unique_ptr<nftnl_expr, ExprFree>;
using GenPtr = std::unique_ptr<nftnl_gen, GenFree>;

inline uint16_t nf_family(IpFamily f) {
  return f == IpFamily::kV4 ? NFPROTO_IPV4 : NFPROTO_IPV6;
}
inline const char* family_name(IpFamily f) {
  return f == IpFamily::kV4 ? "ip" : "ip6";
}

}  // namespace endpointd::proxy::nftnl
