"""Pure values every other part shares: calls, signatures, SKUs, host targets, kernel keys, exact call
records, size expressions, the recipe format and its size space, the probe shapes, and the FA4_AOT_RECORD
call log. Imports nothing of fa4_aot beyond errors and config."""
