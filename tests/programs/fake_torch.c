// shared: libc10_cuda.so
/* Named as PyTorch's CUDA library is (torch/lib/libc10_cuda.so), and nothing else: loaded by
 * loads.c, it makes a C program one that has PyTorch loaded, as far as isolate mode can tell
 * (interposer/src/policy/frameworks.rs says what it set for PyTorch only then). */
int isolate_fake_torch(void) { return 0; }
