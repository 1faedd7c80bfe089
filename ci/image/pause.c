/* The test bed's pause image (containerd's sandbox_image): holds the pod's namespaces.
 * Sleeps until SIGTERM or SIGINT and reaps any child it inherits as PID 1. Built static
 * (musl-gcc -static, else gcc -static) into an image FROM scratch by ci/build-testbed-images. */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static volatile sig_atomic_t stop;

static void on_stop(int sig) { (void)sig; stop = 1; }

static void on_child(int sig) {
    (void)sig;
    int saved = errno;
    while (waitpid(-1, NULL, WNOHANG) > 0) {
    }
    errno = saved;
}

int main(int argc, char **argv) {
    if (argc > 1 && strcmp(argv[1], "-v") == 0) {
        puts("pause (istio-cni test bed)");
        return 0;
    }
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_stop;
    sigemptyset(&sa.sa_mask);
    if (sigaction(SIGTERM, &sa, NULL) || sigaction(SIGINT, &sa, NULL)) {
        perror("pause: sigaction");
        return 1;
    }
    sa.sa_handler = on_child;
    sa.sa_flags = SA_NOCLDSTOP | SA_RESTART;
    if (sigaction(SIGCHLD, &sa, NULL)) {
        perror("pause: sigaction");
        return 1;
    }
    if (getpid() != 1) fputs("pause: warning: not running as PID 1\n", stderr);
    while (!stop) pause();
    fputs("pause: shutting down\n", stderr);
    return 0;
}
