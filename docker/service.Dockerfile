# fa4-aot artifact service: serves a kernel store to a cluster.
#   docker build -f docker/service.Dockerfile -t fa4-aot-service .
#   docker run -p 8700:8700 -v $PWD/cache:/opt/fa4-aot/cache fa4-aot-service
FROM python:3.11-slim
WORKDIR /opt/fa4-aot
RUN pip install --no-cache-dir torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu
COPY pyproject.toml README.md variants.toml ./
COPY fa4_aot ./fa4_aot
COPY service ./service
COPY cache/README.md ./cache/README.md
RUN pip install --no-cache-dir -e ".[server]"
EXPOSE 8700
ENTRYPOINT ["fa4-aot", "serve", "--host", "0.0.0.0", "--port", "8700"]
