// rbln random generators: one default generator per logical device, plus
// torch.Generator(device="rbln").
//
// Random ops run on the host (the CPU fallback), and CPU kernels only accept CPU generators,
// so an rbln generator owns a CPU generator that *is* its state: seeding, get_state/set_state
// and cloning act on it, and the fallback hands it to the CPU kernel.
#pragma once

#include <ATen/core/Generator.h>
#include <c10/core/GeneratorImpl.h>

namespace torch_rbln {

struct GeneratorImpl final : public c10::GeneratorImpl {
  explicit GeneratorImpl(c10::DeviceIndex index, at::Generator host);
  explicit GeneratorImpl(c10::DeviceIndex index);

  void set_current_seed(uint64_t seed) override;
  void set_offset(uint64_t offset) override;
  uint64_t get_offset() const override;
  uint64_t current_seed() const override;
  uint64_t seed() override;
  void set_state(const c10::TensorImpl& state) override;
  c10::intrusive_ptr<c10::TensorImpl> get_state() const override;
  static c10::DeviceType device_type() { return c10::DeviceType::PrivateUse1; }

  const at::Generator& host() const { return host_; }

 private:
  GeneratorImpl* clone_impl() const override;
  at::Generator host_;   // a CPUGeneratorImpl
};

const at::Generator& default_generator(c10::DeviceIndex index);
at::Generator new_generator(c10::DeviceIndex index);

}  // namespace torch_rbln
