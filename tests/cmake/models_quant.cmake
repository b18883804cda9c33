# The models on quantized checkpoints beside the reference comparison: the five quantized folders
# load and pack each linear in its format (the packed-weight cache entry's bytes), stacked parts of
# two schemes are refused naming both, static parts with their own input quantization run apart,
# the observer on quantized linears, made-up weights in each format.
cv_add_test(test_quant_model SOURCES test_quant_model.c LIBS cv_models TIMEOUT 300)
