// XDMF 3 sidecar describing field datasets as uniform grids (one time step per sample).

#include "shardtensor/io/xdmf.hpp"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "hdf5_support.hpp"

namespace shardtensor::io {
namespace {

constexpr const char* where = "io::write_xdmf";

std::string xml_escape(const std::string& text) {
  std::string out;
  for (char c : text) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&apos;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

std::string joined(const std::vector<Index>& values, std::size_t first, std::size_t last) {
  std::ostringstream os;
  for (std::size_t i = first; i < last; ++i) os << (i > first ? " " : "") << values[i];
  return os.str();
}

/// How the XDMF file names the HDF5 file: relative when they share a directory (so the pair
/// can be moved together), absolute otherwise.
std::string h5_reference(const std::string& h5_path, const std::string& xdmf_path) {
  namespace fs = std::filesystem;
  const fs::path h5 = fs::absolute(h5_path).lexically_normal();
  const fs::path xdmf = fs::absolute(xdmf_path).lexically_normal();
  return h5.parent_path() == xdmf.parent_path() ? h5.filename().string() : h5.string();
}

/// One dataset as a temporal collection of uniform grids.
void describe_dataset(std::ostream& xml, const std::string& dataset, const DatasetInfo& info,
                      const std::string& h5_name, const XdmfGeometry& geometry) {
  const std::size_t rank = info.dims.size();
  const int ndims = static_cast<int>(rank) - 2;
  const Index samples = info.dims[0], channels = info.dims[1];
  std::vector<Index> points(info.dims.begin() + 2, info.dims.end());
  for (Index& p : points) ++p;  // cell-centred values: one more point than cells per axis
  const std::string h5_dataset = (dataset.front() == '/' ? "" : "/") + dataset;
  // Display name: group separators would read as paths in ParaView's array list.
  std::string display = dataset.front() == '/' ? dataset.substr(1) : dataset;
  std::replace(display.begin(), display.end(), '/', '_');
  const std::string name = xml_escape(display);
  const int precision = *info.dtype == DataType::float32 ? 4 : 8;
  std::ostringstream origin, spacing;
  for (int d = 0; d < ndims; ++d) {
    origin << (d ? " " : "") << geometry.origin[d];
    spacing << (d ? " " : "") << geometry.spacing[d];
  }
  xml << "    <Grid Name=\"" << name << "\" GridType=\"Collection\" CollectionType=\"Temporal\">\n";
  for (Index s = 0; s < samples; ++s) {
    xml << "      <Grid Name=\"" << name << "_sample" << s << "\" GridType=\"Uniform\">\n"
        << "        <Time Value=\"" << s << "\"/>\n"
        << "        <Topology TopologyType=\"" << ndims << "DCoRectMesh\" Dimensions=\""
        << joined(points, 0, points.size()) << "\"/>\n"
        << "        <Geometry GeometryType=\"" << (ndims == 3 ? "ORIGIN_DXDYDZ" : "ORIGIN_DXDY")
        << "\">\n"
        << "          <DataItem Name=\"Origin\" Dimensions=\"" << ndims
        << "\" NumberType=\"Float\" Precision=\"8\" Format=\"XML\">" << origin.str()
        << "</DataItem>\n"
        << "          <DataItem Name=\"Spacing\" Dimensions=\"" << ndims
        << "\" NumberType=\"Float\" Precision=\"8\" Format=\"XML\">" << spacing.str()
        << "</DataItem>\n"
        << "        </Geometry>\n";
    for (Index c = 0; c < channels; ++c) {
      // HyperSlab rows: start, stride, count over [samples, channels, spatial...].
      std::vector<Index> start(rank, 0), stride(rank, 1), count(info.dims);
      start[0] = s;
      start[1] = c;
      count[0] = count[1] = 1;
      xml << "        <Attribute Name=\"" << name << "_" << c
          << "\" AttributeType=\"Scalar\" Center=\"Cell\">\n"
          << "          <DataItem ItemType=\"HyperSlab\" Type=\"HyperSlab\" Dimensions=\""
          << joined(info.dims, 2, rank) << "\">\n"
          << "            <DataItem Dimensions=\"3 " << rank
          << "\" NumberType=\"Int\" Format=\"XML\">" << joined(start, 0, rank) << " "
          << joined(stride, 0, rank) << " " << joined(count, 0, rank) << "</DataItem>\n"
          << "            <DataItem Dimensions=\"" << joined(info.dims, 0, rank)
          << "\" NumberType=\"Float\" Precision=\"" << precision << "\" Format=\"HDF\">"
          << xml_escape(h5_name) << ":" << xml_escape(h5_dataset) << "</DataItem>\n"
          << "          </DataItem>\n"
          << "        </Attribute>\n";
    }
    xml << "      </Grid>\n";
  }
  xml << "    </Grid>\n";
}

}  // namespace

void write_xdmf(const Communicator& comm, const std::string& h5_path, const std::string& xdmf_path,
                const std::vector<std::string>& datasets, const XdmfGeometry& geometry) {
  impl::agreed(comm, [&] {
    if (comm.rank() != 0) return;
    // Shapes come from the (closed) file, opened by rank 0 alone with the default driver.
    impl::QuietHdf5 quiet;
    SHARDTENSOR_REQUIRE(H5Fis_hdf5(h5_path.c_str()) > 0, where,
                        "'" << h5_path << "' is missing or not an HDF5 file");
    const impl::Hid fid(H5Fopen(h5_path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose);
    SHARDTENSOR_REQUIRE(fid.valid(), where, "cannot open '" << h5_path << "'");
    std::vector<DatasetInfo> infos;
    for (const std::string& dataset : datasets) {
      SHARDTENSOR_REQUIRE(impl::path_exists(fid.get(), dataset), where,
                          "no dataset '" << dataset << "' in '" << h5_path << "'");
      const impl::Hid id(H5Dopen2(fid.get(), dataset.c_str(), H5P_DEFAULT), H5Dclose);
      SHARDTENSOR_REQUIRE(id.valid(), where, "'" << dataset << "' is not a dataset");
      const impl::Hid space(H5Dget_space(id.get()), H5Sclose);
      const impl::Hid type(H5Dget_type(id.get()), H5Tclose);
      DatasetInfo info;
      info.dims = impl::dataspace_dims(space.get());
      if (H5Tget_class(type.get()) == H5T_FLOAT)
        info.dtype = H5Tget_size(type.get()) == 4 ? DataType::float32 : DataType::float64;
      SHARDTENSOR_REQUIRE(info.dims.size() == 4 || info.dims.size() == 5, where,
                          "dataset '" << dataset << "' has dims [" << impl::join(info.dims)
                                      << "]; XDMF grids need [samples, channels, x, y(, z)]");
      SHARDTENSOR_REQUIRE(info.dtype.has_value(), where,
                          "dataset '" << dataset << "' is not float32 or float64");
      infos.push_back(info);
    }
    const std::string h5_name = h5_reference(h5_path, xdmf_path);
    std::ostringstream xml;
    xml << "<?xml version=\"1.0\" ?>\n"
        << "<!DOCTYPE Xdmf SYSTEM \"Xdmf.dtd\" []>\n"
        << "<Xdmf Version=\"3.0\">\n"
        << "  <Domain>\n";
    for (std::size_t i = 0; i < datasets.size(); ++i)
      describe_dataset(xml, datasets[i], infos[i], h5_name, geometry);
    xml << "  </Domain>\n"
        << "</Xdmf>\n";
    // Temporary name and rename, like every output: a failed write leaves the old file.
    const std::string temporary = xdmf_path + ".tmp";
    {
      std::ofstream out(temporary);
      out << xml.str();
      out.close();
      SHARDTENSOR_REQUIRE(out, where, "cannot write '" << temporary << "'");
    }
    if (std::rename(temporary.c_str(), xdmf_path.c_str()) != 0) {
      std::remove(temporary.c_str());
      SHARDTENSOR_FAIL(where, "cannot rename '" << temporary << "' to '" << xdmf_path << "'");
    }
  });
}

}  // namespace shardtensor::io
