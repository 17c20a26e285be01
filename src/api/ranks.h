// What the facade's Ranks holds (src/api/ only: Trainer reads the communicator for train::TrainOptions).
#pragma once

#include <diffucoder/diffucoder.h>

#include <memory>

#include "dist/comm.h"

namespace diffucoder {

struct Ranks::Impl {
  std::unique_ptr<dc::dist::Comm> comm;
};

}  // namespace diffucoder
