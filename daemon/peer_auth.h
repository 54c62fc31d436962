// The peer port's credentials as the daemon wires them: with --drain-peer-token-file, this
// agent's token (drain/peer_identity.h) and a verifier whose keys come from the API server
// (/.well-known/openid-configuration's issuer, then /openid/v1/jwks, over the agent's own API
// credentials; RBAC: the chart binds system:service-account-issuer-discovery) and, for tokens
// without the node claim (Kubernetes before 1.30), the bound pod's spec.nodeName (GET pod,
// cached by uid). Also the endpointd_drain_peer_insecure gauge.
#pragma once

#include "daemon/config.h"
#include "drain/peer_tls.h"
#include "model/result.h"

namespace prometheus {
class Registry;
}

namespace endpointd::daemon {

// Adds the token and the verifier to `files` when cfg asks for identity; sets the insecure
// gauge. An error names what is missing (the token file, its claims, the API server).
Status add_peer_identity(const Config& cfg, prometheus::Registry* registry,
                         drain::PeerTlsFiles* files);

// What /readyz adds while the peer port runs without authentication (empty otherwise).
std::string peer_insecure_warning(const Config& cfg);

}  // namespace endpointd::daemon
