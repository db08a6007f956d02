// crop_pad: sharded == single rank (outputs and gradients), finite differences, values,
// and a crop that would leave a rank empty.

#include <catch2/catch.hpp>

#include "equivalence.hpp"

using namespace shardtensor;
using Catch::Matchers::Contains;

namespace {

/// crop_pad as a module, followed by a conv so parameters and halos take part.
template <class T>
class CropPadConv : public Module<T> {
 public:
  CropPadConv(const Communicator& comm, int ndims, std::array<Index, 3> lower,
              std::array<Index, 3> upper)
      : lower_(lower), upper_(upper) {
    ConvOptions o;
    o.in_channels = o.out_channels = 2;
    o.kernel.assign(ndims, 3);
    o.padding.assign(ndims, 1);
    conv_ = std::make_shared<Conv<T>>(comm, o, "conv");
    this->register_module("conv", conv_);
  }
  Variable<T> forward(const Variable<T>& x) override {
    return conv_->forward(crop_pad(x, lower_, upper_));
  }

 private:
  std::array<Index, 3> lower_, upper_;
  std::shared_ptr<Conv<T>> conv_;
};

}  // namespace

TEMPLATE_TEST_CASE("crop_pad sharded equals one rank", "[crop_pad][equivalence]", float, double) {
  const std::vector<std::vector<Index>> extents{{30}, {20, 16}, {14, 12, 10}};
  // Pad below, crop above (and the reverse), by less than a shard so no rank empties.
  const std::vector<std::pair<std::array<Index, 3>, std::array<Index, 3>>> amounts{
      {{2, 1, 1}, {-1, -2, -1}}, {{-1, -1, 0}, {3, 2, 2}}};
  for (int ndims = 1; ndims <= 3; ++ndims)
    for (auto [lower, upper] : amounts) {
      for (int d = ndims; d < 3; ++d) lower[d] = upper[d] = 0;
      for (const Decomposition& d : test::test_decompositions(
               extents[ndims - 1], test::world_size(), std::vector<bool>(ndims, false), 4))
        test::check_equivalence<TestType>(
            [=](const Communicator& comm) {
              return std::make_shared<CropPadConv<TestType>>(comm, ndims, lower, upper);
            },
            d, 2, 2);
    }
}

TEST_CASE("crop_pad gradients and values", "[crop_pad]") {
  const auto ds = test::test_decompositions({20, 16}, test::world_size(), {false, false}, 4);
  REQUIRE(!ds.empty());
  test::check_gradients_by_finite_differences(
      [](const Communicator& comm) {
        return std::make_shared<CropPadConv<double>>(comm, 2, std::array<Index, 3>{2, -1, 0},
                                                     std::array<Index, 3>{-2, 1, 0});
      },
      ds.back(), 1, 2);

  const Communicator self(MPI_COMM_SELF);
  ShardTensor<double> x(Decomposition({4}, {1}), 0, 1, 1);
  test::fill(
      x, [](Index, Index, const SpatialIndex&, const SpatialIndex& g) { return double(g[0] + 1); });
  const auto y = Kokkos::create_mirror_view_and_copy(
      Kokkos::HostSpace(),
      crop_pad(Variable<double>::field(x), {2, 0, 0}, {-1, 0, 0}).value().view());
  const double expected[5] = {0, 0, 1, 2, 3};  // two zeros in front, the last cell cropped
  REQUIRE(y.extent(2) == 5);
  for (int i = 0; i < 5; ++i) CHECK(y(0, 0, i, 0, 0) == expected[i]);
}

TEST_CASE("crop_pad rejects crops that empty a rank", "[crop_pad][errors]") {
  const Communicator comm;
  const Decomposition d({Index(4 * comm.size()), 8}, {comm.size(), 1});
  const auto x = Variable<float>::field(ShardTensor<float>(d, comm.rank(), 1, 1));
  const std::string message = test::error_message_of([&] { crop_pad(x, {-4, 0, 0}, {0, 0, 0}); });
  CHECK(test::ranks_with_error(message) == comm.size());
  CHECK_THAT(message, Contains(comm.size() == 1 ? "leaves nothing of 4"
                                                : "leaves the ranks at grid position 0"));
  CHECK_THROWS_WITH(crop_pad(x, {0, 0, 1}, {0, 0, 0}),
                    Contains("amounts for dim 2 of a 2-D field"));
}
