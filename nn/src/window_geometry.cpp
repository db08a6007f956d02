#include "shardtensor/nn/window_geometry.hpp"

#include "shardtensor/core/error.hpp"

namespace shardtensor {

Decomposition WindowGeometry::output_decomposition(const Decomposition& input,
                                                   const std::string& where) const {
  SHARDTENSOR_REQUIRE(input.ndims() == ndims, where,
                      "input field has " << input.ndims() << " spatial dims, the kernel " << ndims);
  std::vector<std::vector<Index>> points(ndims);
  std::vector<bool> periodic(ndims);
  for (int d = 0; d < ndims; ++d) {
    const Index n = input.global_extent(d);
    const Index outputs = output_extent(d, n);
    SHARDTENSOR_REQUIRE(outputs >= 1, where,
                        "input extent " << n << " along dim " << d << " is smaller than the kernel "
                                        << kernel[d] << " (dilation " << dilation[d] << ", padding "
                                        << padding[d] << ")");
    const std::vector<Index>& in = input.split_points(d);
    const int parts = input.process_grid(d);
    points[d].push_back(0);
    for (int i = 1; i < parts; ++i) points[d].push_back((in[i] + stride[d] - 1) / stride[d]);
    points[d].push_back(outputs);
    for (int i = 0; i < parts; ++i)
      SHARDTENSOR_REQUIRE(points[d][i] < points[d][i + 1], where,
                          "stride " << stride[d] << " and kernel " << kernel[d]
                                    << " leave the ranks at grid position " << i << " along dim "
                                    << d << " (input cells [" << in[i] << ", " << in[i + 1]
                                    << ")) with no output (global output extent " << outputs
                                    << ")");
    periodic[d] = input.periodic(d);
  }
  return Decomposition::from_split_points(points, periodic);
}

}  // namespace shardtensor
