// shared: libxla_extension.so
/* Named as jaxlib's extension is (jaxlib/xla_extension.so), and nothing else: see fake_torch.c. */
int isolate_fake_jax(void) { return 0; }
