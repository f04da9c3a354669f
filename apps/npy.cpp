// Minimal .npy writer: magic, version 1.0, a padded Python-dict header, then the raw data.
#include "npy.hpp"

#include <cstdio>
#include <vector>

namespace seqpar::app {

Status write_npy(const std::string& path, const HostTensor& tensor) {
  const TensorView& v = tensor.view();
  SP_CHECK_ARG(v.is_contiguous(), "write_npy needs a contiguous tensor");
  DType out_dtype = v.dtype == DType::kBF16 ? DType::kF32 : v.dtype;
  const char* descr = out_dtype == DType::kF64 ? "<f8" : out_dtype == DType::kF32 ? "<f4" : "<f2";
  std::string shape = "(";
  for (int i = 0; i < v.ndim; ++i) shape += (i ? ", " : "") + std::to_string(v.shape[i]);
  if (v.ndim == 1) shape += ",";
  shape += ")";
  std::string header = "{'descr': '" + std::string(descr) + "', 'fortran_order': False, 'shape': " +
                       shape + ", }";
  // Magic (6) + version (2) + header length (2) + header + '\n' is a multiple of 64.
  const size_t unpadded = 10 + header.size() + 1;
  header.append((64 - unpadded % 64) % 64, ' ');
  header.push_back('\n');

  std::FILE* f = std::fopen(path.c_str(), "wb");
  SP_CHECK_ARG(f != nullptr, "cannot open " + path + " for writing");
  const unsigned char preamble[10] = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0,
                                      static_cast<unsigned char>(header.size() & 0xff),
                                      static_cast<unsigned char>(header.size() >> 8)};
  bool ok = std::fwrite(preamble, 1, 10, f) == 10 &&
            std::fwrite(header.data(), 1, header.size(), f) == header.size();
  if (out_dtype == v.dtype) {
    ok = ok && std::fwrite(v.data, 1, tensor.bytes(), f) == tensor.bytes();
  } else {
    std::vector<float> wide(tensor.numel());
    convert(v.data, v.dtype, wide.data(), DType::kF32, wide.size());
    ok = ok && std::fwrite(wide.data(), 4, wide.size(), f) == wide.size();
  }
  ok = (std::fclose(f) == 0) && ok;
  SP_CHECK_ARG(ok, "failed writing " + path);
  return Status::Ok();
}

}  // namespace seqpar::app
