// link: cudart cuda
/* CUDA IPC, as PyTorch's multiprocessing shares CUDA tensors: the parent allocates two buffers
 * and sends their handles down a pipe; the child opens one with the runtime and one with the
 * driver, tries to cudaFree an opened buffer (an error: opened memory is closed, not freed),
 * closes both, and exits; the parent then frees its buffers. Lines are tagged `parent`/`child`.
 * A handle opened in the process that made it fails (the driver says so). */
#include "common.h"

#include <sys/wait.h>
#include <unistd.h>

static int child(int rd) {
    ev_tag = "child";
    cudaIpcMemHandle_t h[2];
    if (read(rd, h, sizeof h) != (ssize_t)sizeof h) {
        say("short read");
        return 1;
    }
    int rc = cudaSetDevice(0);
    say("cudaSetDevice %d", rc);
    void *a = NULL;
    rc = cudaIpcOpenMemHandle(&a, h[0], cudaIpcMemLazyEnablePeerAccess);
    ev("cudaIpcOpenMemHandle", rc, "flags=1 ptr=%s", AP(rc, U64(a), "a"));
    rc = cudaFree(a);
    ev("cudaFree", rc, "ptr=@a");
    CUdeviceptr b = 0;
    int r = cuIpcOpenMemHandle_v2(&b, h[1], 0);
    ev("cuIpcOpenMemHandle_v2", r, "flags=0 ptr=%s", AP(r, b, "b"));
    rc = cudaIpcCloseMemHandle(a);
    ev("cudaIpcCloseMemHandle", rc, "ptr=@a");
    r = cuIpcCloseMemHandle(b);
    ev("cuIpcCloseMemHandle", r, "ptr=@b");
    rc = cudaIpcCloseMemHandle(a);
    ev("cudaIpcCloseMemHandle", rc, "ptr=@a");
    return 0;
}

int main(void) {
    setup();
    int fds[2];
    if (pipe(fds) != 0)
        return 1;
    pid_t pid = fork(); /* before CUDA is touched, as multiprocessing's spawn does */
    if (pid == 0) {
        close(fds[1]);
        int rc = child(fds[0]);
        fflush(stdout);
        return rc;
    }
    close(fds[0]);
    ev_tag = "parent";
    void *x = NULL, *y = NULL;
    int rc = cudaMalloc(&x, 1 << 20);
    ev("cudaMalloc", rc, "size=1048576 ptr=%s", AP(rc, U64(x), "x"));
    rc = cudaMalloc(&y, 4096);
    ev("cudaMalloc", rc, "size=4096 ptr=%s", AP(rc, U64(y), "y"));
    cudaIpcMemHandle_t h[2];
    int g1 = cudaIpcGetMemHandle(&h[0], x);
    int g2 = cudaIpcGetMemHandle(&h[1], y);
    say("cudaIpcGetMemHandle %d %d", g1, g2);
    void *self = NULL;
    rc = cudaIpcOpenMemHandle(&self, h[0], cudaIpcMemLazyEnablePeerAccess);
    ev("cudaIpcOpenMemHandle", rc, "flags=1 ptr=0");
    if (write(fds[1], h, sizeof h) != (ssize_t)sizeof h)
        return 1;
    close(fds[1]);
    int status = 0;
    waitpid(pid, &status, 0);
    say("child exited %d", WIFEXITED(status) ? WEXITSTATUS(status) : -1);
    rc = cudaFree(x);
    ev("cudaFree", rc, "ptr=@x");
    rc = cudaFree(y);
    ev("cudaFree", rc, "ptr=@y");
    return WIFEXITED(status) ? WEXITSTATUS(status) : 1;
}
