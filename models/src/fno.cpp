#include "shardtensor/models/fno.hpp"

#include "shardtensor/models/impl/layer_seed.hpp"

namespace shardtensor::models {

template <class T>
FNO<T>::FNO(const Communicator& comm, FNOOptions options, const std::string& name)
    : comm_(comm), options_(std::move(options)), name_(name) {
  FNOOptions& o = options_;
  const std::string where = "FNO '" + name_ + "'";
  SHARDTENSOR_REQUIRE(o.dims == 2 || o.dims == 3, where,
                      "dims " << o.dims << ": the FNO runs on 2-D and 3-D fields");
  SHARDTENSOR_REQUIRE(o.in_channels >= 1 && o.out_channels >= 1 && o.width >= 1 &&
                          o.projection_channels >= 1,
                      where,
                      "in_channels " << o.in_channels << ", out_channels " << o.out_channels
                                     << ", width " << o.width << " and projection_channels "
                                     << o.projection_channels << " must be at least 1");
  SHARDTENSOR_REQUIRE(o.layers >= 1, where, "layers " << o.layers << " must be at least 1");
  if (o.modes.size() == 1) o.modes.assign(o.dims, o.modes[0]);
  SHARDTENSOR_REQUIRE(int(o.modes.size()) == o.dims, where,
                      "modes has " << o.modes.size() << " entries for a " << o.dims
                                   << "-D field: give one, or one per axis");

  lifting_ = make_pointwise("lifting", o.in_channels, o.width);
  for (int l = 0; l < o.layers; ++l) {
    const std::string index = std::to_string(l);
    SpectralConvOptions s;
    s.in_channels = int(o.width);
    s.out_channels = int(o.width);
    s.modes = o.modes;
    s.seed = impl::layer_seed(o.seed, "spectral" + index);
    spectral_.push_back(
        std::make_shared<SpectralConv<T>>(comm_, s, name_ + ".spectral" + index));
    this->register_module("spectral" + index, spectral_.back());
    bypass_.push_back(make_pointwise("bypass" + index, o.width, o.width));
  }
  projection_hidden_ = make_pointwise("projection_hidden", o.width, o.projection_channels);
  projection_out_ = make_pointwise("projection_out", o.projection_channels, o.out_channels);
}

template <class T>
std::shared_ptr<Conv<T>> FNO<T>::make_pointwise(const std::string& name, Index in, Index out) {
  auto conv = make_pointwise_conv<T>(comm_, options_.dims, in, out,
                                     impl::layer_seed(options_.seed, name), name_ + "." + name);
  this->register_module(name, conv);
  return conv;
}

template <class T>
Variable<T> FNO<T>::forward(const Variable<T>& input) {
  Variable<T> x = (*lifting_)(input);
  for (std::size_t l = 0; l < spectral_.size(); ++l)
    x = activate(add((*spectral_[l])(x), (*bypass_[l])(x)), options_.activation);
  return (*projection_out_)(activate((*projection_hidden_)(x), options_.activation));
}

template class FNO<float>;
template class FNO<double>;

}  // namespace shardtensor::models
