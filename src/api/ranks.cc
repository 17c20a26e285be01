// The public facade's Ranks (include/diffucoder/diffucoder.h) over dist::Comm: MPI's world or one process.
#include <diffucoder/diffucoder.h>

#include <cstdlib>

#include "api/ranks.h"
#include "api/status_convert.h"
#include "dist/agree.h"

namespace diffucoder {

Ranks::Ranks(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Ranks::~Ranks() = default;

Result<std::unique_ptr<Ranks>> Ranks::join(double timeout_s) {
  return dc::api::to_public([&]() -> dc::Result<std::unique_ptr<Ranks>> {
    if (!(timeout_s >= 0)) return dc::invalid_argument("timeout_s: at least 0 seconds (0: no limit)");
    auto impl = std::make_unique<Impl>();
    DC_ASSIGN_OR_RETURN(impl->comm, dc::dist::world_comm(timeout_s));
    return std::unique_ptr<Ranks>(new Ranks(std::move(impl)));
  }());
}

int Ranks::rank() const { return impl_->comm->rank(); }
int Ranks::size() const { return impl_->comm->size(); }
std::string Ranks::backend() const { return impl_->comm->backend(); }

Status Ranks::check_same_settings(const std::vector<std::pair<std::string, std::string>>& settings) {
  std::vector<dc::dist::Setting> mine;
  mine.reserve(settings.size());
  for (const auto& [name, value] : settings) mine.push_back({name, value});
  return dc::api::to_public(dc::dist::check_ranks_agree(*impl_->comm, mine));
}

Status Ranks::barrier() { return dc::api::to_public(impl_->comm->barrier()); }
void Ranks::abort(int code, const std::string& message) {
  impl_->comm->abort(code, message);
  std::abort();  // not reached (Comm::abort ends the job); for the compilers that miss its [[noreturn]]
}

}  // namespace diffucoder
