"""ember's AMD backend: AMDGPU LLVM IR and HIP-style C renderers, HSA code objects, PM4/SDMA queues and MOCK+AMD."""
