import time
from fa4_aot import models, variants, config, modelwork, target
def main():
    sku = variants.load(config.default_variants_file()).sku("h200")
    target.configure(sku)
    from fa4_aot import plan
    m = models.catalog()["llama-3.1-8b"]
    sigs = models.signatures(m, 1)
    for s in sigs:
        calls = modelwork.signature_calls(s, sku)
        t = time.time()
        keys = set()
        for c in calls:
            keys |= set(plan.kernels_for(c))
        print(f"{s.layout} {s.pass_} {s.mask} {len(calls)} calls {time.time()-t:.2f}s {len(keys)} kernels")
if __name__ == "__main__": main()
