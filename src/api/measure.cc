// The measurement internals of measure.h over the facade's Model (its engine); create_trainer is train.cc's.
#include "api/measure.h"

#include "api/model_impl.h"

namespace dc::api {

const DeviceBackend* device_backend(const diffucoder::Model& model) {
  return diffucoder::Model::Impl::of(model).engine->backend();
}

ThreadPool& thread_pool(const diffucoder::Model& model) { return diffucoder::Model::Impl::of(model).engine->pool(); }

void set_profiler(const diffucoder::Model& model, Profiler* profiler) {
  diffucoder::Model::Impl::of(model).engine->set_profiler(profiler);
}

}  // namespace dc::api
