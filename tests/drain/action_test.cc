// The drain action: its syntax, and running each kind for real (a command, a signal through a
// pidfile, an HTTP POST to a server on loopback), with the failures a user meets named.
#include "drain/action.h"

#include <gtest/gtest.h>
#include <httplib.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <thread>

namespace endpointd::drain {
namespace {

using namespace std::chrono_literals;

TEST(DrainAction, ParsesEachKindAndNamesWhatIsWrong) {
  auto e = parse_drain_action("exec:nginx  -s quit");
  ASSERT_TRUE(e) << e.error();
  EXPECT_EQ(e->kind, DrainAction::Kind::kExec);
  EXPECT_EQ(e->argv, (std::vector<std::string>{"nginx", "-s", "quit"}));
  auto s = parse_drain_action("signal:SIGQUIT:/run/nginx.pid");
  ASSERT_TRUE(s) << s.error();
  EXPECT_EQ(s->signal, SIGQUIT);
  EXPECT_EQ(s->pidfile, "/run/nginx.pid");
  auto s1 = parse_drain_action("signal:TERM");
  ASSERT_TRUE(s1);
  EXPECT_EQ(s1->pidfile, "");
  auto h = parse_drain_action("http:http://127.0.0.1:9901/drain_listeners?graceful");
  ASSERT_TRUE(h);
  EXPECT_EQ(h->url, "http://127.0.0.1:9901/drain_listeners?graceful");

  struct Bad {
    std::string spec, says;
  } bad[] = {
      {"nginx -s quit", "expected exec:COMMAND"},
      {"exec:", "no command after exec:"},
      {"exec:   ", "no command after exec:"},
      {"signal:KILLALL", "unknown signal \"KILLALL\""},
      {"signal:QUIT:run/nginx.pid", "the pidfile must be an absolute path"},
      {"http:127.0.0.1:9901/drain", "must start with http:// or https://"},
      {"ftp:x", "unknown kind \"ftp\""},
      {"exec:a\nb", "line break"},
      {"exec:" + std::string(5000, 'x'), "longer than 4096 bytes"},
  };
  for (const auto& b : bad) {
    auto r = parse_drain_action(b.spec);
    ASSERT_FALSE(r) << b.spec;
    EXPECT_NE(r.error().find("drain action \""), std::string::npos) << r.error();
    EXPECT_NE(r.error().find(b.says), std::string::npos) << r.error();
  }
}

Result<std::string> run(const std::string& spec, std::chrono::milliseconds timeout = 2s) {
  auto a = parse_drain_action(spec);
  if (!a) return Error{a.error()};
  return run_drain_action(*a, timeout);
}

TEST(DrainAction, RunsACommandBoundedByItsTimeout) {
  auto ok = run("exec:true");
  ASSERT_TRUE(ok) << ok.error();
  EXPECT_NE(ok->find("exited 0"), std::string::npos) << *ok;
  auto fails = run("exec:sh -c exit\\ 3");
  // No shell quoting: the words are sh, -c, exit\ 3 → sh reports an error, not success.
  EXPECT_FALSE(fails);
  auto three = run("exec:false");
  ASSERT_FALSE(three);
  EXPECT_NE(three.error().find("exited with 1"), std::string::npos) << three.error();
  auto missing = run("exec:/no/such/drain-command --now");
  ASSERT_FALSE(missing);
  EXPECT_NE(missing.error().find("cannot run `/no/such/drain-command`"), std::string::npos)
      << missing.error();
  auto t0 = std::chrono::steady_clock::now();
  auto hangs = run("exec:sleep 30", 300ms);
  auto took = std::chrono::steady_clock::now() - t0;
  ASSERT_FALSE(hangs);
  EXPECT_NE(hangs.error().find("did not finish within 300 ms (killed)"), std::string::npos)
      << hangs.error();
  EXPECT_LT(took, 2s);
}

TEST(DrainAction, SignalsTheProcessAPidfileNames) {
  pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    ::pause();
    ::_exit(0);
  }
  auto dir =
      std::filesystem::temp_directory_path() / ("drain-action-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  std::string pidfile = (dir / "app.pid").string();
  std::ofstream(pidfile) << child << "\n";
  auto r = run("signal:TERM:" + pidfile);
  int status = 0;
  pid_t waited = 0;
  for (int i = 0; i < 200 && waited == 0; ++i) {
    waited = ::waitpid(child, &status, WNOHANG);
    if (waited == 0) std::this_thread::sleep_for(10ms);
  }
  if (waited == 0) {
    ::kill(child, SIGKILL);
    ::waitpid(child, &status, 0);
  }
  ASSERT_TRUE(r) << r.error();
  EXPECT_NE(r->find("SIGTERM sent to pid " + std::to_string(child)), std::string::npos) << *r;
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGTERM);
  auto missing = run("signal:QUIT:" + (dir / "none.pid").string());
  ASSERT_FALSE(missing);
  EXPECT_NE(missing.error().find("cannot read pidfile"), std::string::npos) << missing.error();
  std::ofstream(pidfile) << "garbage\n";
  auto garbage = run("signal:QUIT:" + pidfile);
  ASSERT_FALSE(garbage);
  EXPECT_NE(garbage.error().find("holds no process id"), std::string::npos) << garbage.error();
  std::filesystem::remove_all(dir);
}

TEST(DrainAction, PostsToAnHttpEndpointAndNeedsA2xx) {
  httplib::Server server;
  int posts = 0;
  server.Post("/drain", [&](const httplib::Request&, httplib::Response& res) {
    ++posts;
    res.set_content("draining", "text/plain");
  });
  server.Post("/broken", [](const httplib::Request&, httplib::Response& res) { res.status = 503; });
  int port = server.bind_to_any_port("127.0.0.1");
  ASSERT_GT(port, 0);
  std::thread t([&] { server.listen_after_bind(); });
  for (int i = 0; i < 200 && !server.is_running(); ++i) std::this_thread::sleep_for(5ms);
  std::string base = "http://127.0.0.1:" + std::to_string(port);
  auto ok = run("http:" + base + "/drain");
  auto broken = run("http:" + base + "/broken");
  server.stop();
  t.join();
  ASSERT_TRUE(ok) << ok.error();
  EXPECT_EQ(posts, 1);
  EXPECT_NE(ok->find("answered HTTP 200"), std::string::npos) << *ok;
  ASSERT_FALSE(broken);
  EXPECT_NE(broken.error().find("answered HTTP 503"), std::string::npos) << broken.error();
  // Nobody listening any more.
  auto refused = run("http:" + base + "/drain", 500ms);
  ASSERT_FALSE(refused);
  EXPECT_NE(refused.error().find("POST " + base + "/drain: "), std::string::npos)
      << refused.error();
}

}  // namespace
}  // namespace endpointd::drain
