"""The lean runtime: FA4's entry points replayed from recorded recipes with torch and tvm_ffi only
(never FA4, never the build side)."""
