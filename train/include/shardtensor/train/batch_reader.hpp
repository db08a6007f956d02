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
#include <algorithm>
#include <exception>
#include <sstream>
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

  /// Every dataset's values are checked to be finite when read (finish() throws naming the
  /// sample otherwise); this one is exempt (infer's target: a NaN there gives a NaN error).
  void allow_non_finite(const std::string& dataset) { unchecked_.push_back(dataset); }

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
    file_->communicator().agree(non_finite_values());
    for (std::size_t i = 0; i < tensors_.size(); ++i)
      Kokkos::deep_copy(tensors_[i].view(), hosts_[i]);
    return tensors_;
  }

 private:
  /// A NaN or Inf in the batch, named by file, dataset, sample, channel and global cell ("" if
  /// none in this rank's patch): caught where it enters, rather than as a diverging loss.
  /// One pass over the host buffer, on the host threads; finish() agrees on it over the file's
  /// ranks, so all stop together.
  std::string non_finite_values() const {
    for (std::size_t i = 0; i < hosts_.size(); ++i) {
      if (std::find(unchecked_.begin(), unchecked_.end(), datasets_[i]) != unchecked_.end())
        continue;
      const auto host = hosts_[i];
      const Index size = static_cast<Index>(host.span());
      Index first = size;
      Kokkos::parallel_reduce(
          "BatchReader::non_finite",
          Kokkos::RangePolicy<Kokkos::DefaultHostExecutionSpace>(0, size),
          [&](const Index v, Index& found) {
            const T value = host.data()[v];
            if (!(value - value == T(0)) && v < found) found = v;  // NaN or Inf
          },
          Kokkos::Min<Index>(first));
      if (first >= size) continue;  // none (the Min reduction starts at the largest Index)
      const ShardTensor<T>& t = tensors_[i];
      const Index per_sample = size / Index(samples_.size());
      const Index s = first / per_sample,
                  cells = t.local_extent(0) * t.local_extent(1) * t.local_extent(2);
      const Index c = (first % per_sample) / cells, cell = first % cells;
      const Box owned = t.global_box();
      const Index z = cell % t.local_extent(2), y = (cell / t.local_extent(2)) % t.local_extent(1),
                  x = cell / (t.local_extent(2) * t.local_extent(1));
      std::ostringstream m;
      m << file_->path() << ": dataset '" << datasets_[i] << "', sample " << samples_[s]
        << " holds a non-finite value (" << host.data()[first] << " at channel " << c << ", cell ("
        << owned.lower[0] + x;
      for (int d = 1; d < decomposition_.ndims(); ++d)
        m << ", " << owned.lower[d] + (d == 1 ? y : z);
      m << ")): fix or drop the sample; training and inference need finite data";
      return m.str();
    }
    return "";
  }

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
  std::vector<std::string> unchecked_;
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
