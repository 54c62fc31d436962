// libnftnl + libmnl: the socket that sends the encoder's batches (proxy/nft_encode.h) and
// collects their acknowledgements, lists what the namespace holds, and reads the ruleset
// generation.
#include "proxy/netlink.h"

#include <arpa/inet.h>
#include <errno.h>
#include <libmnl/libmnl.h>
#include <libnftnl/chain.h>
#include <libnftnl/common.h>
#include <libnftnl/gen.h>
#include <libnftnl/set.h>
#include <linux/netfilter.h>
#include <linux/netfilter/nf_tables.h>
#include <linux/netfilter/nfnetlink.h>
#include <sys/socket.h>
#include <sys/time.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <optional>
#include <set>
#include <string_view>
#include <tuple>

#include "proxy/nftnl_util.h"

namespace endpointd::proxy {

struct NetlinkBackend::Socket {
  struct Close {
    void operator()(mnl_socket* s) const { mnl_socket_close(s); }
  };
  std::unique_ptr<mnl_socket, Close> nl;
  uint32_t portid = 0;
};

NetlinkBackend::NetlinkBackend(std::unique_ptr<Socket> s) : sock_(std::move(s)) {}
NetlinkBackend::~NetlinkBackend() = default;

uint32_t NetlinkBackend::port_id() const {
  return sock_->portid;
}

Result<std::unique_ptr<NetlinkBackend>> NetlinkBackend::open() {
  auto s = std::make_unique<Socket>();
  s->nl.reset(mnl_socket_open(NETLINK_NETFILTER));
  if (!s->nl) return Error{std::string("netlink socket: ") + std::strerror(errno)};
  if (mnl_socket_bind(s->nl.get(), 0, MNL_SOCKET_AUTOPID) < 0) {
    return Error{std::string("netlink bind: ") + std::strerror(errno)};
  }
  s->portid = mnl_socket_get_portid(s->nl.get());
  int fd = mnl_socket_get_fd(s->nl.get());
  int one = 1;
  setsockopt(fd, SOL_NETLINK, NETLINK_CAP_ACK, &one, sizeof(one));
  setsockopt(fd, SOL_NETLINK, NETLINK_EXT_ACK, &one, sizeof(one));
  int rcv = 8 << 20;
  setsockopt(fd, SOL_SOCKET, SO_RCVBUFFORCE, &rcv, sizeof(rcv));
  timeval tv{5, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  return std::unique_ptr<NetlinkBackend>(new NetlinkBackend(std::move(s)));
}

Result<BatchStats> NetlinkBackend::send(const Batch& b) {
  int fd = mnl_socket_get_fd(sock_->nl.get());
  int snd = static_cast<int>(b.bytes.size()) + (1 << 16);
  setsockopt(fd, SOL_SOCKET, SO_SNDBUFFORCE, &snd, sizeof(snd));
  if (mnl_socket_sendto(sock_->nl.get(), b.bytes.data(), b.bytes.size()) < 0) {
    return Error{std::string("netlink send: ") + std::strerror(errno)};
  }
  size_t expected = b.what.size();
  size_t acked = 0;
  std::string first_error;
  std::vector<char> buf(1 << 16);
  while (acked < expected) {
    ssize_t n = mnl_socket_recvfrom(sock_->nl.get(), buf.data(), buf.size());
    if (n < 0) {
      if (!first_error.empty()) break;  // the kernel stops acking after an abort in some paths
      return Error{std::string("netlink receive: ") + std::strerror(errno)};
    }
    auto len = static_cast<int>(n);
    for (auto* nlh = reinterpret_cast<nlmsghdr*>(buf.data()); mnl_nlmsg_ok(nlh, len);
         nlh = mnl_nlmsg_next(nlh, &len)) {
      if (nlh->nlmsg_type != NLMSG_ERROR) continue;
      if (nlh->nlmsg_len < mnl_nlmsg_size(sizeof(nlmsgerr))) continue;
      nlmsgerr err;
      std::memcpy(&err, mnl_nlmsg_get_payload(nlh), sizeof(err));
      ++acked;
      if (err.error != 0 && first_error.empty()) {
        size_t idx = nlh->nlmsg_seq - b.first_seq;
        std::string what =
            idx < b.what.size() ? b.what[idx] : "message " + std::to_string(nlh->nlmsg_seq);
        first_error = what + ": " + std::strerror(-err.error);
      }
    }
  }
  if (!first_error.empty()) return Error{first_error};
  return BatchStats{b.what.size(), b.bytes.size(), b.elements};
}

namespace {

// Every message's length fits in what is left of the buffer. libmnl's own check compares the
// length as a signed int, so a length above 2^31 passes it and the loop walks out of the
// buffer (found by fuzz_netlink); the kernel never sends one, but nothing here assumes that.
bool well_formed(const void* buf, size_t len) {
  const auto* p = static_cast<const unsigned char*>(buf);
  while (len >= sizeof(nlmsghdr)) {
    nlmsghdr h;
    std::memcpy(&h, p, sizeof h);
    if (h.nlmsg_len < sizeof(nlmsghdr) || h.nlmsg_len > len) return false;
    size_t step = std::min<size_t>(NLMSG_ALIGN(h.nlmsg_len), len);
    p += step;
    len -= step;
  }
  return true;
}

// The attributes of one nf_tables message that endpointd reads, each taken only if it has the
// type's shape (a NUL-terminated string, a 32-bit number). Read with libmnl alone: libnftnl's
// parsers exit() the process on an attribute of an unexpected shape ("kernel ABI is broken",
// found by fuzz_netlink), which an agent must not do whatever a reply holds.
struct NftAttrs {
  const char* str[4] = {};  // by attribute type 1..3 (table, name)
  std::optional<uint32_t> u32_1;
};

NftAttrs nft_attrs(const nlmsghdr* m) {
  NftAttrs out;
  mnl_attr_parse(
      m, sizeof(nfgenmsg),
      [](const nlattr* a, void* data) -> int {
        auto* o = static_cast<NftAttrs*>(data);
        uint16_t type = mnl_attr_get_type(a);
        if (type >= 1 && type <= 3 && mnl_attr_validate(a, MNL_TYPE_NUL_STRING) == 0)
          o->str[type] = mnl_attr_get_str(a);
        if (type == 1 && mnl_attr_validate(a, MNL_TYPE_U32) == 0)
          o->u32_1 = ntohl(mnl_attr_get_u32(a));
        return MNL_CB_OK;
      },
      &out);
  return out;
}

// Whether m is the nf_tables message `msg` (NFT_MSG_NEW...).
bool is_nft(const nlmsghdr* m, uint16_t msg) {
  return (m->nlmsg_type >> 8) == NFNL_SUBSYS_NFTABLES && (m->nlmsg_type & 0xff) == msg;
}

}  // namespace

int parse_dump_names(const void* buf, size_t len, uint32_t seq, uint32_t portid, uint16_t msg_type,
                     std::vector<std::string>& names, std::vector<uint32_t>* sizes) {
  if (!well_formed(buf, len)) {
    errno = EBADMSG;
    return MNL_CB_ERROR;
  }
  struct Ctx {
    uint16_t type;
    std::vector<std::string>* names;
    std::vector<uint32_t>* sizes;
  } ctx{msg_type, &names, sizes};
  auto cb = [](const nlmsghdr* m, void* data) -> int {
    auto* c = static_cast<Ctx*>(data);
    bool chain = c->type == NFT_MSG_GETCHAIN;
    uint16_t want = chain ? NFT_MSG_NEWCHAIN : NFT_MSG_NEWSET;
    if (!is_nft(m, want)) return MNL_CB_OK;
    NftAttrs a = nft_attrs(m);
    // NFTA_{CHAIN,SET}_TABLE is 1; the name is NFTA_CHAIN_NAME (3) or NFTA_SET_NAME (2).
    const char* table = a.str[NFTA_CHAIN_TABLE];
    const char* name = a.str[chain ? int{NFTA_CHAIN_NAME} : int{NFTA_SET_NAME}];
    // A message without a table or a name is skipped, never dereferenced.
    if (!table || !name || std::strcmp(table, kTableName) != 0) return MNL_CB_OK;
    c->names->emplace_back(name);
    if (!c->sizes) return MNL_CB_OK;
    // A set's size: NFTA_SET_DESC { NFTA_SET_DESC_SIZE }, 0 when it has none.
    uint32_t size = 0;
    mnl_attr_parse(
        m, sizeof(nfgenmsg),
        [](const nlattr* attr, void* out) -> int {
          if (mnl_attr_get_type(attr) != NFTA_SET_DESC) return MNL_CB_OK;
          mnl_attr_parse_nested(
              attr,
              [](const nlattr* d, void* out2) -> int {
                if (mnl_attr_get_type(d) == NFTA_SET_DESC_SIZE &&
                    mnl_attr_validate(d, MNL_TYPE_U32) == 0) {
                  *static_cast<uint32_t*>(out2) = ntohl(mnl_attr_get_u32(d));
                }
                return MNL_CB_OK;
              },
              out);
          return MNL_CB_OK;
        },
        &size);
    c->sizes->push_back(size);
    return MNL_CB_OK;
  };
  return mnl_cb_run(buf, len, seq, portid, cb, &ctx);
}

int parse_generation(const void* buf, size_t len, uint32_t seq, uint32_t portid,
                     std::optional<uint32_t>& id) {
  if (!well_formed(buf, len)) {
    errno = EBADMSG;
    return MNL_CB_ERROR;
  }
  auto cb = [](const nlmsghdr* m, void* data) -> int {
    if (!is_nft(m, NFT_MSG_NEWGEN)) return MNL_CB_OK;
    auto* out = static_cast<std::optional<uint32_t>*>(data);
    if (auto v = nft_attrs(m).u32_1) *out = *v;  // NFTA_GEN_ID
    return MNL_CB_OK;
  };
  return mnl_cb_run(buf, len, seq, portid, cb, &id);
}

int parse_set_elements(const void* buf, size_t len, uint32_t seq, uint32_t portid,
                       std::vector<KernelElement>& elements) {
  if (!well_formed(buf, len)) {
    errno = EBADMSG;
    return MNL_CB_ERROR;
  }
  // The bytes of NFTA_DATA_VALUE inside a nested key or data attribute.
  static constexpr auto value_of = [](const nlattr* nest, std::string& out) {
    mnl_attr_parse_nested(
        nest,
        [](const nlattr* a, void* data) -> int {
          if (mnl_attr_get_type(a) == NFTA_DATA_VALUE) {
            static_cast<std::string*>(data)->assign(
                static_cast<const char*>(mnl_attr_get_payload(a)), mnl_attr_get_payload_len(a));
          }
          return MNL_CB_OK;
        },
        &out);
  };
  // NFTA_SET_ELEM_DATA: a value, or a verdict (NFTA_DATA_VERDICT: its code and chain).
  static constexpr auto data_of = [](const nlattr* nest, KernelElement& out) {
    mnl_attr_parse_nested(
        nest,
        [](const nlattr* a, void* data) -> int {
          auto* e = static_cast<KernelElement*>(data);
          if (mnl_attr_get_type(a) == NFTA_DATA_VALUE) {
            e->data.assign(static_cast<const char*>(mnl_attr_get_payload(a)),
                           mnl_attr_get_payload_len(a));
          }
          if (mnl_attr_get_type(a) != NFTA_DATA_VERDICT) return MNL_CB_OK;
          mnl_attr_parse_nested(
              a,
              [](const nlattr* v, void* data) -> int {
                auto* e = static_cast<KernelElement*>(data);
                uint16_t type = mnl_attr_get_type(v);
                if (type == NFTA_VERDICT_CODE && mnl_attr_validate(v, MNL_TYPE_U32) == 0)
                  e->verdict = static_cast<int32_t>(ntohl(mnl_attr_get_u32(v)));
                if (type == NFTA_VERDICT_CHAIN && mnl_attr_validate(v, MNL_TYPE_NUL_STRING) == 0)
                  e->chain = mnl_attr_get_str(v);
                return MNL_CB_OK;
              },
              data);
          return MNL_CB_OK;
        },
        &out);
  };
  auto cb = [](const nlmsghdr* m, void* data) -> int {
    if (!is_nft(m, NFT_MSG_NEWSETELEM)) return MNL_CB_OK;
    mnl_attr_parse(
        m, sizeof(nfgenmsg),
        [](const nlattr* a, void* data) -> int {
          if (mnl_attr_get_type(a) != NFTA_SET_ELEM_LIST_ELEMENTS) return MNL_CB_OK;
          mnl_attr_parse_nested(
              a,
              [](const nlattr* el, void* data) -> int {
                if (mnl_attr_get_type(el) != NFTA_LIST_ELEM) return MNL_CB_OK;
                KernelElement e;
                mnl_attr_parse_nested(
                    el,
                    [](const nlattr* f, void* data) -> int {
                      auto* e = static_cast<KernelElement*>(data);
                      switch (mnl_attr_get_type(f)) {
                        case NFTA_SET_ELEM_KEY:
                          value_of(f, e->key);
                          break;
                        case NFTA_SET_ELEM_KEY_END:
                          value_of(f, e->key_end);
                          break;
                        case NFTA_SET_ELEM_DATA:
                          data_of(f, *e);
                          break;
                        case NFTA_SET_ELEM_FLAGS:
                          if (mnl_attr_validate(f, MNL_TYPE_U32) == 0)
                            e->flags = ntohl(mnl_attr_get_u32(f));
                          break;
                        case NFTA_SET_ELEM_USERDATA:
                          e->userdata.assign(static_cast<const char*>(mnl_attr_get_payload(f)),
                                             mnl_attr_get_payload_len(f));
                          break;
                        default:
                          break;
                      }
                      return MNL_CB_OK;
                    },
                    &e);
                if (!e.key.empty())
                  static_cast<std::vector<KernelElement>*>(data)->push_back(std::move(e));
                return MNL_CB_OK;
              },
              data);
          return MNL_CB_OK;
        },
        data);
    return MNL_CB_OK;
  };
  return mnl_cb_run(buf, len, seq, portid, cb, &elements);
}

Result<std::vector<KernelElement>> NetlinkBackend::list_elements(IpFamily f,
                                                                 const std::string& set_name) {
  // A dump answer fills the kernel's skb (up to ~16 KiB a message); a big buffer is fewer reads.
  std::vector<char> buf(1 << 17);
  uint32_t seq = seq_++;
  nlmsghdr* nlh = nftnl_nlmsg_build_hdr(buf.data(), NFT_MSG_GETSETELEM, nftnl::nf_family(f),
                                        NLM_F_DUMP | NLM_F_ACK, seq);
  nftnl::SetPtr set(nftnl_set_alloc());
  nftnl_set_set_str(set.get(), NFTNL_SET_TABLE, kTableName);
  nftnl_set_set_str(set.get(), NFTNL_SET_NAME, set_name.c_str());
  nftnl_set_set_u32(set.get(), NFTNL_SET_FAMILY, nftnl::nf_family(f));
  nftnl_set_elems_nlmsg_build_payload(nlh, set.get());
  if (mnl_socket_sendto(sock_->nl.get(), nlh, nlh->nlmsg_len) < 0)
    return Error{std::string("netlink send: ") + std::strerror(errno)};
  std::vector<KernelElement> out;
  for (;;) {
    ssize_t n = mnl_socket_recvfrom(sock_->nl.get(), buf.data(), buf.size());
    if (n < 0) return Error{std::string("netlink receive: ") + std::strerror(errno)};
    int ret = parse_set_elements(buf.data(), static_cast<size_t>(n), seq, sock_->portid, out);
    if (ret < 0) {
      if (errno == ENOENT) return std::vector<KernelElement>{};  // no such set: no elements
      return Error{"netlink dump of set " + set_name + ": " + std::strerror(errno)};
    }
    if (ret == MNL_CB_STOP) break;
  }
  return out;
}

Status NetlinkBackend::forget_affinity(IpFamily f,
                                       const std::function<bool(std::string_view)>& stale) {
  auto records = list_elements(f, names::kAffinity);
  if (!records) return Error{records.error()};
  // A record is <saddr> . <vip> : <backend>.
  size_t a = f == IpFamily::kV4 ? 4 : 16;
  std::vector<std::string> keys;
  std::string pair;
  for (const auto& r : *records) {
    if (r.key.size() <= a) continue;
    pair.assign(r.key, a, std::string::npos).append(r.data);
    if (stale(pair)) keys.push_back(r.key);
  }
  if (keys.empty()) return {};
  Batch b = build_forget_affinity_batch(f, keys, seq_);
  seq_ += static_cast<uint32_t>(b.what.size()) + 2;
  auto r = send(b);
  if (!r) return Error{r.error()};
  return {};
}

Result<std::vector<std::string>> NetlinkBackend::list_names(uint16_t msg_type, IpFamily f,
                                                            std::vector<uint32_t>* sizes) {
  std::vector<char> buf(MNL_SOCKET_BUFFER_SIZE);
  uint32_t seq = seq_++;
  nlmsghdr* nlh =
      nftnl_nlmsg_build_hdr(buf.data(), msg_type, nftnl::nf_family(f), NLM_F_DUMP | NLM_F_ACK, seq);
  if (msg_type == NFT_MSG_GETSET) {
    nftnl::SetPtr s(nftnl_set_alloc());
    nftnl_set_set_str(s.get(), NFTNL_SET_TABLE, kTableName);
    nftnl_set_set_u32(s.get(), NFTNL_SET_FAMILY, nftnl::nf_family(f));
    nftnl_set_nlmsg_build_payload(nlh, s.get());
  }
  if (mnl_socket_sendto(sock_->nl.get(), nlh, nlh->nlmsg_len) < 0) {
    return Error{std::string("netlink send: ") + std::strerror(errno)};
  }
  std::vector<std::string> names;
  for (;;) {
    ssize_t n = mnl_socket_recvfrom(sock_->nl.get(), buf.data(), buf.size());
    if (n < 0) return Error{std::string("netlink receive: ") + std::strerror(errno)};
    int ret = parse_dump_names(buf.data(), static_cast<size_t>(n), seq, sock_->portid, msg_type,
                               names, sizes);
    if (ret < 0) {
      if (errno == ENOENT) return std::vector<std::string>{};  // no table yet
      return Error{std::string("netlink dump: ") + std::strerror(errno)};
    }
    if (ret == MNL_CB_STOP) break;
  }
  return names;
}

Result<uint32_t> NetlinkBackend::ruleset_generation() {
  std::vector<char> buf(MNL_SOCKET_BUFFER_SIZE);
  uint32_t seq = seq_++;
  nlmsghdr* nlh = nftnl_nlmsg_build_hdr(buf.data(), NFT_MSG_GETGEN, AF_UNSPEC, NLM_F_ACK, seq);
  if (mnl_socket_sendto(sock_->nl.get(), nlh, nlh->nlmsg_len) < 0) {
    return Error{std::string("netlink send: ") + std::strerror(errno)};
  }
  std::optional<uint32_t> id;
  for (;;) {
    ssize_t n = mnl_socket_recvfrom(sock_->nl.get(), buf.data(), buf.size());
    if (n < 0) return Error{std::string("netlink receive: ") + std::strerror(errno)};
    int ret = parse_generation(buf.data(), static_cast<size_t>(n), seq, sock_->portid, id);
    if (ret < 0) return Error{std::string("netlink getgen: ") + std::strerror(errno)};
    if (ret == MNL_CB_STOP) break;
  }
  if (!id) return Error{"netlink getgen: no generation in the answer"};
  return *id;
}

void NetlinkBackend::set_quiet_full_sync(std::function<bool(bool)> listen,
                                         std::function<void()> foreign) {
  std::lock_guard lock(quiet_mu_);
  listen_ = std::move(listen);
  foreign_ = std::move(foreign);
}

NetlinkBackend::QuietStats NetlinkBackend::quiet_stats() const {
  std::lock_guard lock(quiet_mu_);
  return quiet_stats_;
}

// After a full sync: the records whose <vip> . <backend> is in no affinity-backends-T set of
// the table (endpoints removed while endpointd was not running, say) are deleted.
Result<BatchStats> NetlinkBackend::forget_unrouted_affinity(const std::vector<const Table*>& tables,
                                                            BatchStats committed) {
  for (const Table* t : tables) {
    std::vector<const Set*> routed;
    for (const auto& [name, set] : t->sets) {
      if (set.shape == SetShape::kVipBackendSet) routed.push_back(&set);
    }
    Status s = forget_affinity(t->family, [&](std::string_view p) {
      for (const Set* set : routed) {
        if (set->elements.contains(p)) return false;
      }
      return true;
    });
    if (!s) return Error{s.error()};
  }
  return committed;
}

Result<KernelTable> NetlinkBackend::list_table(const Table* t, IpFamily f, bool trust_digests) {
  KernelTable k;
  auto chains = list_names(NFT_MSG_GETCHAIN, f);
  if (!chains) return Error{chains.error()};
  std::vector<uint32_t> sizes;
  auto sets = list_names(NFT_MSG_GETSET, f, &sizes);
  if (!sets) return Error{sets.error()};
  k.chains = std::move(*chains);
  k.sets = std::move(*sets);
  for (size_t i = 0; i < k.sets.size() && i < sizes.size(); ++i) k.sizes[k.sets[i]] = sizes[i];
  if (!t) return k;
  // The content digests the kernel holds (a few dozen elements): a set whose entry is the
  // table's own entry holds what the table wants (the entry is written in the same
  // transaction as every change to its set), so it is not listed.
  std::set<std::string> same;
  if (std::find(k.sets.begin(), k.sets.end(), names::kDigests) != k.sets.end()) {
    auto d = list_elements(f, names::kDigests);
    if (!d) return Error{d.error()};
    k.digests = std::move(*d);
    std::map<uint32_t, const std::string*> have;
    for (const auto& e : k.digests) {
      uint32_t key = 0;
      if (e.key.size() != sizeof key) continue;
      std::memcpy(&key, e.key.data(), sizeof key);
      have[key] = &e.userdata;
    }
    for (const auto& [name, set] : t->sets) {
      auto entry = digest_entry(set);
      if (!entry) continue;
      auto h = have.find(entry->key);
      // As nft writes a comment: type 0, its length with the NUL, the text, a NUL.
      if (h != have.end() && h->second->size() == entry->comment.size() + 3 &&
          h->second->compare(2, entry->comment.size(), entry->comment) == 0) {
        same.insert(name);
      }
    }
  }
  for (const auto& name : k.sets) {
    auto want = t->sets.find(name);
    // Only the sets the table keeps; the affinity map's records are the packet path's.
    if (want == t->sets.end() || want->second.shape == SetShape::kAffinity) continue;
    if (trust_digests && same.count(name)) {
      k.unchanged.insert(name);
      continue;
    }
    // Too small for what the table wants: made anew, so its elements need no listing.
    if (sized(want->second.shape) && outgrows(k.sizes[name], want->second.elements.size()))
      continue;
    // A dump comes a socket buffer at a time, each a new walk of the set that skips what was
    // sent; a hash set the kernel resized in between (its deferred rehash after a big insert,
    // or a shrink after deletes) is walked in another order, and the dump both repeats and
    // misses elements. A missed element could be a removed endpoint's, left in place: so a
    // dump with a repeat is taken again, and a set that never lists cleanly is not trusted
    // (left out: it is flushed and filled again, as before the listing existed).
    for (int attempt = 0; attempt < 3; ++attempt) {
      auto els = list_elements(f, name);
      if (!els) return Error{els.error()};
      auto by_key = [](const KernelElement& a, const KernelElement& b) {
        return std::tie(a.key, a.key_end, a.flags) < std::tie(b.key, b.key_end, b.flags);
      };
      std::sort(els->begin(), els->end(), by_key);
      bool repeated =
          std::adjacent_find(els->begin(), els->end(), [](const auto& a, const auto& b) {
            return a.key == b.key && a.key_end == b.key_end && a.flags == b.flags;
          }) != els->end();
      if (!repeated) {
        k.elements.emplace(name, std::move(*els));
        break;
      }
      ++unsettled_dumps_;
    }
  }
  return k;
}

void NetlinkBackend::distrust_digests() {
  std::lock_guard lock(quiet_mu_);
  distrust_next_ = true;
}

Result<BatchStats> NetlinkBackend::full_sync(const std::vector<const Table*>& tables) {
  std::function<bool(bool)> listen;
  std::function<void()> foreign;
  {
    std::lock_guard lock(quiet_mu_);
    if (listen_ && !listen_next_) {
      listen = listen_;
      foreign = foreign_;
    }
    listen_next_ = false;
  }
  bool trust = true;
  {
    std::lock_guard lock(quiet_mu_);
    trust = !distrust_next_;
  }
  std::optional<uint32_t> before;
  if (listen) {
    auto g = ruleset_generation();
    if (g && listen(false)) before = *g;  // else: an ordinary full sync, listened to
  }
  // What the kernel holds, listed after the generation was read: a commit by anyone else from
  // here to this batch's is seen by the generation check below (or, when this sync is not
  // quiet, by the monitor), and repaired by another full sync.
  KernelTable kernel[2];
  for (IpFamily f : {IpFamily::kV4, IpFamily::kV6}) {
    const Table* want = nullptr;
    for (const Table* t : tables) {
      if (t->family == f) want = t;
    }
    auto k = list_table(want, f, trust);
    if (!k) {
      if (before) listen(true);
      return Error{k.error()};
    }
    kernel[f == IpFamily::kV4 ? 0 : 1] = std::move(*k);
  }
  Batch b = build_full_sync_batch(tables, kernel[0], kernel[1], seq_);
  seq_ += static_cast<uint32_t>(b.what.size()) + 2;
  auto r = send(b);
  if (r) {
    for (const auto& k : kernel) {
      r->sets_unchanged += k.unchanged.size();
      r->sets_listed += k.elements.size();
    }
    // The kernel's sets now: each with its size and the table's element count.
    room_.clear();
    for (const auto& sz : b.sizes) {
      for (const Table* t : tables) {
        if (t->family != sz.family) continue;
        auto it = t->sets.find(sz.set);
        if (it != t->sets.end()) room_[{sz.family, sz.set}] = {sz.size, it->second.elements.size()};
      }
    }
  }
  if (r && !trust) {
    std::lock_guard lock(quiet_mu_);
    distrust_next_ = false;  // listed whole and repaired; digests hold again
  }
  if (!before) return r ? forget_unrouted_affinity(tables, *r) : r;
  listen(true);
  auto after = ruleset_generation();
  // The batch committed: the generation moved by exactly one unless someone else committed
  // too (a failed batch is retried by the sink with backoff, and checked again then).
  bool others = r && (!after || *after - *before != 1u);
  {
    std::lock_guard lock(quiet_mu_);
    ++quiet_stats_.quiet;
    if (others) {
      ++quiet_stats_.foreign;
      listen_next_ = true;
      distrust_next_ = true;  // someone else's change may be in endpointd's sets
    }
  }
  if (others) foreign();
  // After the generation check: this batch of endpointd's own would count as someone else's.
  return r ? forget_unrouted_affinity(tables, *r) : r;
}

// What each set's element count becomes with `ch` (sets it deletes are gone).
std::map<std::pair<IpFamily, std::string>, long> NetlinkBackend::counts_after(
    const std::vector<TableChanges>& list) const {
  std::map<std::pair<IpFamily, std::string>, long> out;
  for (const auto& ch : list) {
    auto count = [&](const std::string& set) -> long& {
      auto [it, fresh] = out.try_emplace({ch.family, set}, 0);
      if (fresh) {
        auto r = room_.find({ch.family, set});
        if (r != room_.end()) it->second = static_cast<long>(r->second.count);
      }
      return it->second;
    };
    for (const auto& [set, _] : ch.add_elements) ++count(set);
    for (const auto& [set, _] : ch.del_elements) --count(set);
  }
  return out;
}

bool NetlinkBackend::fits(const std::vector<TableChanges>& list) const {
  std::set<std::pair<IpFamily, std::string>> made;
  for (const auto& ch : list) {
    for (const auto& s : ch.add_sets) made.insert({ch.family, s.name});
  }
  for (const auto& [set, n] : counts_after(list)) {
    if (made.count(set)) continue;  // made by this batch with room for what it adds
    auto r = room_.find(set);
    if (r != room_.end() && outgrows(r->second.size, static_cast<size_t>(std::max(n, 0L))))
      return false;
  }
  return true;
}

Result<BatchStats> NetlinkBackend::apply(const std::vector<TableChanges>& list) {
  Batch b = build_changes_batch(list, seq_);
  seq_ += static_cast<uint32_t>(b.what.size()) + 2;
  auto counts = counts_after(list);
  auto r = send(b);
  if (!r) return r;
  for (const auto& sz : b.sizes) room_[{sz.family, sz.set}] = {sz.size, 0};
  for (const auto& [set, n] : counts) room_[set].count = static_cast<size_t>(std::max(n, 0L));
  for (const auto& ch : list) {
    for (const auto& s : ch.del_sets) room_.erase({ch.family, s});
  }
  // Committed: no new record names these pairs; delete those the map holds.
  for (const auto& ch : list) {
    if (ch.forget_affinity.empty()) continue;
    std::set<std::string_view> gone(ch.forget_affinity.begin(), ch.forget_affinity.end());
    Status s = forget_affinity(ch.family, [&](std::string_view p) { return gone.count(p) > 0; });
    if (!s) return Error{s.error()};
  }
  return r;
}

Result<BatchStats> NetlinkBackend::cleanup() {
  BatchStats total;
  for (IpFamily f : {IpFamily::kV4, IpFamily::kV6}) {
    // One batch per family, so a missing ip table does not keep the ip6 one.
    Batch batch = build_cleanup_batch(f, seq_);
    seq_ += static_cast<uint32_t>(batch.what.size()) + 2;
    auto r = send(batch);
    if (!r && r.error().find(std::strerror(ENOENT)) == std::string::npos) return r;
    if (r) {
      total.messages += r->messages;
      total.bytes += r->bytes;
    }
  }
  return total;
}

}  // namespace endpointd::proxy
