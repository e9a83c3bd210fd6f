"""Everything that touches FA4, CuTe DSL or quack internals (imported only where FA4 is about to run)."""
