// Attributes on the file root, groups and datasets.

#include "shardtensor/io/attributes.hpp"

#include <functional>

#include "hdf5_support.hpp"

namespace shardtensor::impl {
namespace {

std::string object_name(const std::string& object) {
  return object.empty() ? "/" : object;
}

/// Names of the attributes of an open object.
std::vector<std::string> attribute_names(hid_t object) {
  std::vector<std::string> names;
  hsize_t index = 0;
  H5Aiterate2(
      object, H5_INDEX_NAME, H5_ITER_INC, &index,
      [](hid_t, const char* name, const H5A_info_t*, void* out) -> herr_t {
        static_cast<std::vector<std::string>*>(out)->push_back(name);
        return 0;
      },
      &names);
  return names;
}

/// Collective write: replaces any attribute of that name with a new one of `type` and
/// `space`, and writes `data` (the same on every rank; HDF5 writes it once).
void write_attribute(io::File& file, const std::string& object, const std::string& name, hid_t type,
                     hid_t memory_type, hid_t space, const void* data) {
  constexpr const char* where = "io::write_attribute";
  Hid target;
  bool exists = false;
  agreed(file.communicator(), [&] {
    require_writable(file, where);
    target = open_object(file, object, where);
    QuietHdf5 quiet;
    exists = H5Aexists(target.get(), name.c_str()) > 0;
  });
  QuietHdf5 quiet;
  herr_t status = exists ? H5Adelete(target.get(), name.c_str()) : 0;
  const Hid attribute(
      status < 0 ? -1
                 : H5Acreate2(target.get(), name.c_str(), type, space, H5P_DEFAULT, H5P_DEFAULT),
      H5Aclose);
  if (attribute.valid()) status = H5Awrite(attribute.get(), memory_type, data);
  file.communicator().agree(attribute.valid() && status >= 0
                                ? ""
                                : std::string(where) + ": writing attribute '" + name + "' of '" +
                                      object_name(object) + "' in '" + file.path() + "' failed");
}

/// Opens attribute `name` of `object`, checks its class with `class_ok` (describing the
/// expected kind in errors) and passes it to `read` — all on every rank, errors agreed.
void read_attribute(const io::File& file, const std::string& object, const std::string& name,
                    const char* kind, const std::function<bool(H5T_class_t)>& class_ok,
                    const std::function<void(hid_t attribute, hid_t type, Index points)>& read) {
  constexpr const char* where = "io::read_attribute";
  agreed(file.communicator(), [&] {
    const Hid target = open_object(file, object, where);
    QuietHdf5 quiet;
    if (H5Aexists(target.get(), name.c_str()) <= 0) {
      std::string existing;
      for (const std::string& n : attribute_names(target.get()))
        existing += (existing.empty() ? "" : ", ") + n;
      SHARDTENSOR_FAIL(where, "no attribute '" << name << "' on '" << object_name(object)
                                               << "' in '" << file.path() << "'; it has "
                                               << (existing.empty() ? "none" : existing));
    }
    const Hid attribute(H5Aopen(target.get(), name.c_str(), H5P_DEFAULT), H5Aclose);
    const Hid type(H5Aget_type(attribute.get()), H5Tclose);
    const Hid space(H5Aget_space(attribute.get()), H5Sclose);
    SHARDTENSOR_REQUIRE(class_ok(H5Tget_class(type.get())), where,
                        "attribute '" << name << "' of '" << object_name(object) << "' in '"
                                      << file.path() << "' is not " << kind);
    read(attribute.get(), type.get(), H5Sget_simple_extent_npoints(space.get()));
  });
}

void require_single(Index points, const std::string& name, const char* kind) {
  SHARDTENSOR_REQUIRE(
      points == 1, "io::read_attribute",
      "attribute '" << name << "' holds " << points << " values, expected one " << kind);
}

void require_read(herr_t status, const std::string& name) {
  SHARDTENSOR_REQUIRE(status >= 0, "io::read_attribute",
                      "reading attribute '" << name << "' failed");
}

bool is_number(H5T_class_t c) {
  return c == H5T_INTEGER || c == H5T_FLOAT;
}

}  // namespace

void write_string_attribute(io::File& file, const std::string& object, const std::string& name,
                            const std::string& value) {
  // Fixed-length, null-terminated: readable by h5py, h5dump and plain C.
  const Hid type(H5Tcopy(H5T_C_S1), H5Tclose);
  H5Tset_size(type.get(), value.size() + 1);
  H5Tset_strpad(type.get(), H5T_STR_NULLTERM);
  const Hid space(H5Screate(H5S_SCALAR), H5Sclose);
  write_attribute(file, object, name, type.get(), type.get(), space.get(), value.c_str());
}

void write_int64_attribute(io::File& file, const std::string& object, const std::string& name,
                           std::int64_t value) {
  const Hid space(H5Screate(H5S_SCALAR), H5Sclose);
  write_attribute(file, object, name, H5T_STD_I64LE, H5T_NATIVE_INT64, space.get(), &value);
}

void write_double_attribute(io::File& file, const std::string& object, const std::string& name,
                            double value) {
  const Hid space(H5Screate(H5S_SCALAR), H5Sclose);
  write_attribute(file, object, name, H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, space.get(), &value);
}

void write_uint64s_attribute(io::File& file, const std::string& object, const std::string& name,
                             const std::vector<std::uint64_t>& value) {
  const hsize_t count = value.size();
  const Hid space(value.empty() ? H5Screate(H5S_NULL) : H5Screate_simple(1, &count, nullptr),
                  H5Sclose);
  const std::uint64_t dummy = 0;
  write_attribute(file, object, name, H5T_STD_U64LE, H5T_NATIVE_UINT64, space.get(),
                  value.empty() ? &dummy : value.data());
}

std::string read_string_attribute(const io::File& file, const std::string& object,
                                  const std::string& name) {
  std::string value;
  read_attribute(
      file, object, name, "a string", [](H5T_class_t c) { return c == H5T_STRING; },
      [&](hid_t attribute, hid_t type, Index points) {
        require_single(points, name, "string");
        if (H5Tis_variable_str(type) > 0) {  // as h5py writes str attributes
          const Hid memory_type(H5Tcopy(H5T_C_S1), H5Tclose);
          H5Tset_size(memory_type.get(), H5T_VARIABLE);
          char* text = nullptr;
          require_read(H5Aread(attribute, memory_type.get(), &text), name);
          value = text ? text : "";
          H5free_memory(text);
        } else {
          std::vector<char> text(H5Tget_size(type) + 1, '\0');
          require_read(H5Aread(attribute, type, text.data()), name);
          value = text.data();  // up to the first null: drops padding
        }
      });
  return value;
}

std::int64_t read_int64_attribute(const io::File& file, const std::string& object,
                                  const std::string& name) {
  std::int64_t value = 0;
  read_attribute(
      file, object, name, "an integer", [](H5T_class_t c) { return c == H5T_INTEGER; },
      [&](hid_t attribute, hid_t, Index points) {
        require_single(points, name, "integer");
        require_read(H5Aread(attribute, H5T_NATIVE_INT64, &value), name);
      });
  return value;
}

double read_double_attribute(const io::File& file, const std::string& object,
                             const std::string& name) {
  double value = 0;
  read_attribute(file, object, name, "a number", is_number,
                 [&](hid_t attribute, hid_t, Index points) {
                   require_single(points, name, "number");
                   require_read(H5Aread(attribute, H5T_NATIVE_DOUBLE, &value), name);
                 });
  return value;
}

std::vector<std::uint64_t> read_uint64s_attribute(const io::File& file, const std::string& object,
                                                  const std::string& name) {
  std::vector<std::uint64_t> value;
  read_attribute(
      file, object, name, "an integer array", [](H5T_class_t c) { return c == H5T_INTEGER; },
      [&](hid_t attribute, hid_t, Index points) {
        value.resize(static_cast<std::size_t>(points));
        if (points > 0) require_read(H5Aread(attribute, H5T_NATIVE_UINT64, value.data()), name);
      });
  return value;
}

}  // namespace shardtensor::impl

namespace shardtensor::io {

bool has_attribute(const File& file, const std::string& object, const std::string& name) {
  bool found = false;
  impl::agreed(file.communicator(), [&] {
    const hid_t fid = impl::file_id(file, "io::has_attribute");
    impl::QuietHdf5 quiet;
    const std::string path = impl::object_name(object);
    if (path != "/" && !impl::path_exists(fid, path)) return;
    const impl::Hid target(H5Oopen(fid, path.c_str(), H5P_DEFAULT), H5Oclose);
    found = target.valid() && H5Aexists(target.get(), name.c_str()) > 0;
  });
  return found;
}

}  // namespace shardtensor::io
