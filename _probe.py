from pathlib import Path
from fa4_aot import coverage, models, variants, config, modelwork
from fa4_aot.store import Store
import time
def main():
    sku = variants.load(config.default_variants_file()).sku("h200")
    cat = models.catalog()
    calls = []
    for name, tp in [("dit-xl-2",1),("vit-h-14",1),("phi-3-mini-4k",1),("gemma-2-9b",1),("gpt-oss-20b",8),("deepseek-v3",8),("falcon-7b",1),("sd3-medium",1),("olmo-2-13b",8)]:
        for s in models.signatures(cat[name], tp):
            calls.append((name, s, s.call(2, 1000, 1000) if s.layout not in ("paged","seqused") else s.call(2, 1, 3000)))
    t=time.time()
    res = coverage.plan_calls(sku, Path("/tmp/x"), [c for _,_,c in calls], jobs=2)
    print(time.time()-t, len(calls))
    for (n,s,c),(k,e) in zip(calls,res):
        if e or not k: print(n, c.describe(), e)
if __name__ == "__main__": main()
