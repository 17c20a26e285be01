// HttpServer over the public BatchEngine: limits the engine refuses make bind() fail, naming the field, and the
// server shuts down cleanly without an engine thread.
#include <gtest/gtest.h>

#include <string>

#include "server/running_server.h"

namespace dc::server::test {
namespace {

class ServerBatchOptions : public TinyVocabSuite {};

TEST_F(ServerBatchOptions, RefusedLimitsFailBindNamingTheField) {
  ServerOptions o;
  o.port = 0;
  o.scheduler.max_batch_rows = 0;
  HttpServer server(model(), o);
  const Status st = server.bind();
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("max_batch_rows: must be >= 1"), std::string::npos) << st.message();
  server.stop();
}

}  // namespace
}  // namespace dc::server::test
