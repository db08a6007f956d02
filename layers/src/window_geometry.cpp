#include "shardtensor/layers/window_geometry.hpp"

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
                                        << padding_lower[d] << " before, " << padding_upper[d]
                                        << " after)");
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

bool WindowGeometry::reads_owned_cells_only(const Decomposition& input) const {
  for (int d = 0; d < ndims; ++d) {
    if (padding_lower[d] != 0 || padding_upper[d] != 0) return false;
    const std::vector<Index>& in = input.split_points(d);
    const Index outputs = output_extent(d, input.global_extent(d));
    for (int i = 0; i < input.process_grid(d); ++i) {
      // The shard's last output: the last whose anchor o * stride lies before its end.
      const Index last = std::min(outputs, (in[i + 1] + stride[d] - 1) / stride[d]) - 1;
      if (last * stride[d] + dilation[d] * (kernel[d] - 1) >= in[i + 1]) return false;
    }
  }
  return true;
}

}  // namespace shardtensor
