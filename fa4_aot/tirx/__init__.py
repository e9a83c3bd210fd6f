"""The TIRx FA4 kernel family: MLC's TIRx port of FlashAttention-4's Blackwell forward kernel
(tirx-kernels `ported/flashattention/flash_attention4.py`), a second family beside FA4's CuTe DSL kernels.

Each kernel is specialized to one static problem (batch, sequence lengths, heads, head dim 128, causal or not,
fp16) and to the two scheduler constants the port fixes for the B200 (MAX_CTAS = 148, L2_SIZE = 50 MiB), which
here come from each SKU's row. The parts:
  problem.py      the static problem, its schedule and the SKU constants it consumes (pure)
  entries.py      the variants file's [[tirx]] entries: explicit shapes and the catalog's training shapes
  toolenv.py      the pinned toolchain and the interpreter that has it (tirx-kernels, apache-tvm, nvcc)
  compiler.py     the seam that imports TVM: trace, tvm.compile(tir_pipeline="tirx"), nvcc -> cubin (run in
                  the TIRx environment as `python -m fa4_aot.tirx.compiler`)
  kernel_file.py  the store object: cubin plus what launching it needs
  producer.py     building a problem list for a SKU into the store (same objects and index as FA4's kernels)
  tensor_maps.py  the host side of a launch: TMA tensor-map fields, grid, block, shared memory (pure)
  cuda_driver.py  the CUDA driver through ctypes: encode tensor maps, load the cubin, launch
  loading.py      fa4_aot.load(..., family="tirx"): find the kernel for this device, strict
"""
