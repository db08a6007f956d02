#pragma once
// import_onnx: an ONNX file (as torch.onnx.export writes it) as a Graph of sharded layers,
// with the file's initializers as its parameters. Read through Debian's libonnx (the protobuf
// classes and the checker), never a hand-written parser. docs/onnx.md lists the operators.

#include <memory>
#include <string>
#include <vector>

#include "shardtensor/comm/communicator.hpp"
#include "shardtensor/models/builder.hpp"
#include "shardtensor/models/graph.hpp"

namespace shardtensor::models {

/// Whether this build reads ONNX files (it was built with libonnx-dev).
bool onnx_available();

/// What an ONNX file takes and gives, read from its graph's input and output (no layer is
/// made): their ranks and channel counts (0 where the file leaves them symbolic).
struct OnnxSignature {
  int input_rank = 0, output_rank = 0;
  Index input_channels = 0, output_channels = 0;
};

/// The signature of the ONNX file at `path`. Collective over `comm`: a file that one rank
/// cannot read is an error on every rank.
OnnxSignature onnx_signature(const std::string& path, const Communicator& comm);

/// The network in the ONNX file at `path`: its one input (N, C, spatial...) with
/// shape.in_channels channels and shape.dims spatial axes, its one output a field. Every rank
/// reads the file; a file that cannot be read, fails ONNX's checker or holds an operator,
/// attribute or pattern that has no sharded equivalent throws Error on every rank, naming the
/// node, its op type and what is not supported. `key` names the model in messages.
///
/// The weights of convs, norms, Linear layers and PReLU train. An initializer that only
/// multiplies or offsets a field per channel (ConvNeXt's layer scale, an input normalisation's
/// buffer) is a constant unless `trained_initializers` lists it (names or shell wildcards,
/// "*.layer_scale"): ONNX does not say which initializers were parameters (ONNX Runtime's
/// training takes the same list). A listed one becomes a parameter of the graph named as the
/// initializer; a pattern that matches none is an error.
template <class T>
std::shared_ptr<Graph<T>> import_onnx(const std::string& path, const Communicator& comm,
                                      const ModelShape& shape, const std::string& key = "model",
                                      const std::vector<std::string>& trained_initializers = {});

/// Writes the ONNX file at `source` (the one `graph` was imported from) to `output` with the
/// graph's current parameters and buffers in place of the initializers they came from: the
/// same nodes, the trained weights, for PyTorch or ONNX Runtime. Atomic (a temporary file,
/// then a rename); rank 0 writes. Collective over `comm`.
template <class T>
void export_onnx(const std::string& source, const Graph<T>& graph, const std::string& output,
                 const Communicator& comm);

extern template void export_onnx<float>(const std::string&, const Graph<float>&,
                                        const std::string&, const Communicator&);
extern template void export_onnx<double>(const std::string&, const Graph<double>&,
                                         const std::string&, const Communicator&);

extern template std::shared_ptr<Graph<float>> import_onnx<float>(
    const std::string&, const Communicator&, const ModelShape&, const std::string&,
    const std::vector<std::string>&);
extern template std::shared_ptr<Graph<double>> import_onnx<double>(
    const std::string&, const Communicator&, const ModelShape&, const std::string&,
    const std::vector<std::string>&);

}  // namespace shardtensor::models
