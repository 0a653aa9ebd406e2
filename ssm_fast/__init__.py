"""ssm_fast: numba-parallel CPU kernels for the selective scan (issue 3; not built yet)."""
