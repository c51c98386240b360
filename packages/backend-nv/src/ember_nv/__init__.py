"""ember-backend-nv: NVIDIA GPUs for ember (CUDA C, PTX, the CUDA driver API, NV HCQ queues and MOCK+NV)."""
