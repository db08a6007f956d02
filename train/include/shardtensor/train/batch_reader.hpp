#pragma once
// BatchReader: reads a batch of samples of field datasets (e.g. input and target) into this
// rank's patch, in the background while the previous batch computes when MPI allows threads.
//
// The background thread makes only HDF5/MPI-IO calls on the file's own communicator (a
// duplicate no other thread uses) and writes into host memory allocated beforehand, so it
// needs MPI_THREAD_MULTIPLE but no thread-safe HDF5 or Kokkos: the caller must not touch
// the same HDF5 library from another thread until finish() returns.

#include "shardtensor/comm/environment.hpp"

#include <Kokkos_Core.hpp>
#include <exception>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "shardtensor/core/shard_tensor.hpp"
#include "shardtensor/io/field_io.hpp"

namespace shardtensor {

template <class T>
class BatchReader {
 public:
  /// `datasets`: names of field datasets, each [samples, channels[i], spatial...] over
  /// `decomposition` (this rank is `rank` in it). `background`: prefetch on a thread if the
  /// MPI library was initialised with MPI_THREAD_MULTIPLE (else reads happen in start()).
  BatchReader(const io::File& file, std::vector<std::string> datasets, std::vector<Index> channels,
              const Decomposition& decomposition, int rank, bool background)
      : file_(&file),
        datasets_(std::move(datasets)),
        channels_(std::move(channels)),
        decomposition_(decomposition),
        rank_(rank) {
    background_ = background && mpi_thread_multiple();
  }
  BatchReader(const BatchReader&) = delete;
  BatchReader& operator=(const BatchReader&) = delete;
  ~BatchReader() {
    if (worker_.joinable()) worker_.join();
  }

  bool reads_in_background() const { return background_; }

  /// Starts reading `samples` (the same number on every rank of the file's communicator;
  /// values may differ between data groups). Collective.
  void start(const std::vector<Index>& samples) {
    SHARDTENSOR_REQUIRE(!pending_, "BatchReader::start", "the previous batch was not finished");
    pending_ = true;
    tensors_.clear();
    hosts_.clear();
    for (std::size_t i = 0; i < datasets_.size(); ++i) {
      tensors_.push_back(ShardTensor<T>::uninitialized(decomposition_, rank_, Index(samples.size()),
                                                       channels_[i], {}, datasets_[i]));
      hosts_.push_back(Kokkos::create_mirror_view(tensors_.back().view()));
    }
    samples_ = samples;
    if (background_)
      worker_ = std::thread([this] { read_all(); });
    else
      read_all();
  }

  /// Waits for the batch; one tensor (batch, channels[i], ...) per dataset.
  std::vector<ShardTensor<T>> finish() {
    SHARDTENSOR_REQUIRE(pending_, "BatchReader::finish", "no batch was started");
    if (worker_.joinable()) worker_.join();
    pending_ = false;
    if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
    for (std::size_t i = 0; i < tensors_.size(); ++i)
      Kokkos::deep_copy(tensors_[i].view(), hosts_[i]);
    return tensors_;
  }

 private:
  void read_all() {
    try {
      for (std::size_t i = 0; i < datasets_.size(); ++i) {
        const ShardTensor<T>& t = tensors_[i];
        impl::ShardLayout layout = impl::shard_layout(t);
        layout.batch = 1;
        const std::size_t sample_size = hosts_[i].span() / samples_.size();
        for (std::size_t s = 0; s < samples_.size(); ++s)
          impl::read_shard(*file_, datasets_[i], samples_[s], layout, impl::element_type_of<T>(),
                           hosts_[i].data() + s * sample_size, false);
      }
    } catch (...) {
      error_ = std::current_exception();
    }
  }

  const io::File* file_;
  std::vector<std::string> datasets_;
  std::vector<Index> channels_;
  Decomposition decomposition_;
  int rank_;
  bool background_ = false;
  bool pending_ = false;
  std::vector<Index> samples_;
  std::vector<ShardTensor<T>> tensors_;
  std::vector<typename FieldView<T>::HostMirror> hosts_;
  std::thread worker_;
  std::exception_ptr error_;
};

}  // namespace shardtensor
