# fa4-aot build farm node: a Ray node that compiles FA4 kernels for CUDA 13 and CUDA 12 SKUs (no GPU needed).
#   docker build -f docker/farm.Dockerfile -t fa4-aot-farm .
# Two environments, because the cu12 and cu13 CuTe compilers cannot share one (see fa4_aot/compile/flavours.py):
#   /opt/venv       the default install (cu13) plus Ray: runs the driver and Ray's own processes
#   /opt/venv-cu12  the cu12 flavour plus Ray: Ray starts CUDA 12 SKUs' workers with its python (runtime_env)
FROM python:3.11-slim
WORKDIR /opt/fa4-aot
ENV PATH=/opt/venv/bin:$PATH FA4_AOT_PYTHON_CU12=/opt/venv-cu12/bin/python RAY_USAGE_STATS_ENABLED=0
COPY pyproject.toml README.md variants.toml ./
COPY fa4_aot ./fa4_aot
COPY service ./service
COPY docker/flavour-venv.sh ./docker/flavour-venv.sh
COPY cache/README.md ./cache/README.md
# CPU-only torch in both environments: the build never touches a GPU (see fa4_aot/target.py)
RUN python -m venv /opt/venv && python -m venv /opt/venv-cu12 && \
    for v in /opt/venv /opt/venv-cu12; do \
      $v/bin/pip install --no-cache-dir torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu; done && \
    /opt/venv/bin/pip install --no-cache-dir -e ".[build,farm]" && \
    FA4_AOT_FARM=1 docker/flavour-venv.sh 12 /opt/venv-cu12
ENTRYPOINT []
CMD ["fa4-aot", "--help"]
