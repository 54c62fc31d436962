// kube-proxy's KubeProxyConfiguration (kubeproxy.config.k8s.io/v1alpha1) read as endpointd
// settings, so `endpointd run --config` can take the file kube-proxy ran with (kubeadm's
// kube-system/kube-proxy ConfigMap, key config.conf).
//
// What takes effect (as the flag it maps to; each flag's row of the option table,
// daemon/options.h, names its keys, and the plain scalars among them are read from there):
//   clusterCIDR                         --cluster-cidr (comma-separated list)
//   detectLocalMode ClusterCIDR or ""   (local traffic is detected by --cluster-cidr)
//   nodePortAddresses                   --nodeport-addresses (CIDRs; "primary" is ignored)
//   iptables.masqueradeAll, nftables.masqueradeAll   --masquerade-all
//   healthzBindAddress                  --health-listen (default kube-proxy's 0.0.0.0:10256)
//   metricsBindAddress                  --admin-listen (default kube-proxy's 127.0.0.1:10249)
//   hostnameOverride                    --node-name
//   clientConnection.kubeconfig         --kubeconfig
//   logging.format text|json            --log-format
//   conntrack.*                         --conntrack-* (values given; nulls, which kube-proxy
//                                       fills with its defaults, are reported once)
// As in kube-proxy, the probes (/healthz, /livez, /readyz) are on healthzBindAddress and
// /metrics on metricsBindAddress (with endpointd's /debug/state); port 0 turns either off.
// `mode` must be nftables or empty (endpointd always programs its own nftables tables);
// another mode is reported. Every other key whose value is not empty, zero or false — sync
// periods, iptables/ipvs/winkernel settings, bindAddress, ... — is reported as ignored, one
// entry per key, with the reason. kubeadm writes every field, most at their zero value, and
// those mean "kube-proxy's default", so they are not reported. A key that is no field of
// v1alpha1 is an error naming it: kube-proxy falls back to lenient decoding and only logs it,
// but a typo that silently changes nothing is what an operator swapping proxies must not get.
#pragma once

#include <yaml-cpp/yaml.h>

#include <string>
#include <vector>

#include "model/result.h"

namespace endpointd::daemon {

inline constexpr const char* kKubeProxyApiVersion = "kubeproxy.config.k8s.io/v1alpha1";
inline constexpr const char* kKubeProxyKind = "KubeProxyConfiguration";

// Values are as written: decode_config checks them like a flag's, naming `from` in its error.
struct KubeProxySetting {
  std::string flag;                 // the endpointd flag's long name, without "--"
  std::vector<std::string> values;  // one value, or the elements of a list flag
  std::string from;                 // the KubeProxyConfiguration key(s) it came from
};

struct KubeProxyIgnored {
  std::string key;    // dotted path, e.g. "conntrack.maxPerCore"
  std::string value;  // as written (a map or list is shown in YAML flow style)
  std::string reason;
};

struct KubeProxyConversion {
  std::vector<KubeProxySetting> settings;
  std::vector<KubeProxyIgnored> ignored;

  // The setting for `flag`, or null.
  const KubeProxySetting* find(const std::string& flag) const;
  bool is_ignored(const std::string& key) const;
  // One log line per key: first what took effect, then what was ignored.
  std::vector<std::string> report() const;
};

// True if `root` is a map with `kind: KubeProxyConfiguration`.
bool is_kubeproxy_configuration(const YAML::Node& root);
// Pure: reads the parsed document, returns endpointd settings and what was ignored; an error
// (naming the key) when the file cannot be used: another kind or apiVersion, a value of the
// wrong shape, a healthzBindAddress that is not an address.
Result<KubeProxyConversion> convert_kubeproxy_configuration(const YAML::Node& root);

}  // namespace endpointd::daemon
