#pragma once
// Umbrella header of the io module: parallel HDF5 fields, replicated arrays, attributes,
// atomic output and XDMF.

#include "shardtensor/io/array_io.hpp"
#include "shardtensor/io/atomic_output.hpp"
#include "shardtensor/io/attributes.hpp"
#include "shardtensor/io/dataset.hpp"
#include "shardtensor/io/field_io.hpp"
#include "shardtensor/io/file.hpp"
#include "shardtensor/io/xdmf.hpp"
