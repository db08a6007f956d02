#include "stop_on_signal.hpp"

namespace shardtensor::impl {

volatile std::sig_atomic_t StopOnSignal::received_ = 0;

}  // namespace shardtensor::impl
