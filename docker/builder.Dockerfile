# fa4-aot build host: cross-compiles FA4 kernels for a GPU SKU on a machine with no GPU.
#   docker build -f docker/builder.Dockerfile -t fa4-aot-builder .
#   docker run --rm -v $PWD/cache:/opt/fa4-aot/cache fa4-aot-builder build --sku b200 -j 4
FROM python:3.11-slim
WORKDIR /opt/fa4-aot
# gcc links each kernel into a shared library for the lean runtime (fa4_aot/fa4/link.py)
RUN apt-get update && apt-get install -y --no-install-recommends gcc libc6-dev && rm -rf /var/lib/apt/lists/*
# CPU-only torch: the build never touches a GPU (see fa4_aot/target.py)
RUN pip install --no-cache-dir torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu
COPY pyproject.toml README.md variants.toml ./
COPY fa4_aot ./fa4_aot
COPY cache/README.md ./cache/README.md
RUN pip install --no-cache-dir -e ".[build]"
ENTRYPOINT ["fa4-aot"]
CMD ["--help"]
