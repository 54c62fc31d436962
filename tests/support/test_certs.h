// A throwaway PKI for TLS tests, made with the openssl CLI in a directory the test owns: a CA
// (ca.crt, ca.key), a server certificate for 127.0.0.1 and localhost (server.crt,
// server.key), a client certificate with CN endpointd (client.crt, client.key), and base64
// copies of ca.crt and client.key (ca.b64, client-key.b64) for kubeconfig *-data fields.
#pragma once

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace endpointd::testing {

inline std::string slurp_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Writes `script` to DIR/NAME and runs it with sh; empty on success, otherwise what it printed.
inline std::string run_in(const std::string& dir, const std::string& name,
                          const std::string& script) {
  {
    std::ofstream out(dir + "/" + name, std::ios::trunc);
    out << script;
  }
  const std::string cmd = "sh '" + dir + "/" + name + "' >'" + dir + "/openssl.log' 2>&1";
  if (std::system(cmd.c_str()) == 0) return "";
  std::string log = slurp_file(dir + "/openssl.log");
  return log.empty() ? "openssl failed" : log;
}

// Empty on success; otherwise what openssl printed.
inline std::string make_test_certs(const std::string& dir) {
  const std::string script =
      "set -e\ncd '" + dir +
      "'\n"
      "K='-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes'\n"
      "openssl req -x509 $K -keyout ca.key -out ca.crt -days 2 -subj /CN=endpointd-test-ca\n"
      "openssl req $K -keyout server.key -out server.csr -subj /CN=127.0.0.1\n"
      "printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\\nextendedKeyUsage=serverAuth\\n' "
      "> server.ext\n"
      "openssl x509 -req -in server.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 2 "
      "-extfile server.ext -out server.crt\n"
      "openssl req $K -keyout client.key -out client.csr -subj /CN=endpointd\n"
      "printf 'extendedKeyUsage=clientAuth\\n' > client.ext\n"
      "openssl x509 -req -in client.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 2 "
      "-extfile client.ext -out client.crt\n"
      "openssl base64 -A -in ca.crt -out ca.b64\n"
      "openssl base64 -A -in client.key -out client-key.b64\n";
  return run_in(dir, "make-certs.sh", script);
}

// A CA (ca.crt, ca.key) and, per name, NAME.crt and NAME.key: a certificate naming node NAME
// (CN and DNS subject alternative name), for server and client auth, as the chart issues to
// each node's agent for peer traffic. Empty on success; otherwise what openssl printed.
inline std::string make_node_certs(const std::string& dir, const std::vector<std::string>& names) {
  std::string script =
      "set -e\ncd '" + dir +
      "'\n"
      "K='-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes'\n"
      "openssl req -x509 $K -keyout ca.key -out ca.crt -days 2 -subj /CN=endpointd-peer-test-ca\n";
  for (const auto& n : names) {
    script += "openssl req $K -keyout '" + n + ".key' -out '" + n + ".csr' -subj '/CN=" + n +
              "'\n"
              "printf 'subjectAltName=DNS:" +
              n + "\\nextendedKeyUsage=serverAuth,clientAuth\\n' > '" + n +
              ".ext'\n"
              "openssl x509 -req -in '" +
              n + ".csr' -CA ca.crt -CAkey ca.key -CAcreateserial -days 2 -extfile '" + n +
              ".ext' -out '" + n + ".crt'\n";
  }
  return run_in(dir, "make-node-certs.sh", script);
}

}  // namespace endpointd::testing
