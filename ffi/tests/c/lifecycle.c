/*
 * Drives the isolator's whole lifecycle through the C ABI, as the agent would, for
 * ffi/tests/c_lifecycle.rs. Usage: lifecycle DIR NODE...
 *
 * DIR holds the protobuf inputs the Rust test wrote (params.bin, id.bin, config.bin,
 * update.bin, recover.bin) and receives the answers (launch.bin, usage.bin, status.bin).
 * NODE... are device nodes a child process opens once isolated, and again after the update;
 * each open is reported on stdout as "<phase> <path> <errno>" (0 when it opened).
 * Everything else goes to stderr; any unexpected status exits 1.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "mesos_gpu.h"

static char dir[4096];
static char log_tag[] = "agent-log";

static unsigned char *slurp(const char *name, size_t *len) {
    char path[8192];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "rb");
    if (!f) { perror(path); exit(1); }
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *buf = malloc(n > 0 ? (size_t)n : 1);
    if (n > 0 && fread(buf, 1, (size_t)n, f) != (size_t)n) { perror(path); exit(1); }
    fclose(f);
    *len = (size_t)n;
    return buf;
}

static void spit(const char *name, const unsigned char *buf, size_t len) {
    char path[8192];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(buf, 1, len, f) != len) { perror(path); exit(1); }
    fclose(f);
}

static void expect(MgpuStatus got, MgpuStatus want, const char *what, const char *err) {
    if (got != want) {
        fprintf(stderr, "%s: got %s, want %s: %s\n", what, mgpu_status_name((uint32_t)got),
                mgpu_status_name((uint32_t)want), err);
        exit(1);
    }
}

static void on_log(MgpuLogLevel level, const char *target, const char *message, void *userdata) {
    fprintf(stderr, "LOG %d %s %s [%s]\n", (int)level, target, message, (const char *)userdata);
}

/* The child: waits for a command byte; 'o' opens every node and reports, 'q' exits. */
static void child(int cmd, int ack, int argc, char **argv) {
    char c;
    int phase = 0;
    while (read(cmd, &c, 1) == 1 && c == 'o') {
        phase++;
        for (int i = 2; i < argc; i++) {
            int fd = open(argv[i], O_RDWR);
            printf("%d %s %d\n", phase, argv[i], fd >= 0 ? 0 : errno);
            if (fd >= 0) close(fd);
        }
        fflush(stdout);
        if (write(ack, "k", 1) != 1) _exit(2);
    }
    _exit(0);
}

static void probe(int cmd, int ack) {
    char c;
    if (write(cmd, "o", 1) != 1 || read(ack, &c, 1) != 1) { fprintf(stderr, "child gone\n"); exit(1); }
}

int main(int argc, char **argv) {
    if (argc < 2) { fprintf(stderr, "usage: lifecycle DIR NODE...\n"); return 2; }
    snprintf(dir, sizeof dir, "%s", argv[1]);
    char err[1024] = "";
    size_t params_len, id_len, config_len, update_len, recover_len;
    unsigned char *params = slurp("params.bin", &params_len);
    unsigned char *id = slurp("id.bin", &id_len);
    unsigned char *config = slurp("config.bin", &config_len);
    unsigned char *update = slurp("update.bin", &update_len);
    unsigned char *recover = slurp("recover.bin", &recover_len);

    fprintf(stderr, "libmesos_gpu %s\n", mgpu_version());
    expect(mgpu_set_log_callback(on_log, log_tag, MGPU_LOG_INFO, err, sizeof err), MGPU_OK, "log", err);

    MgpuIsolator *h = NULL;
    expect(mgpu_isolator_new(params, params_len, &h, err, sizeof err), MGPU_OK, "new", err);
    expect(mgpu_recover(h, recover, recover_len, err, sizeof err), MGPU_OK, "recover", err);

    /* prepare: ask the size first, then retry with a buffer that fits. */
    size_t len = 0;
    MgpuStatus s = mgpu_prepare(h, id, id_len, config, config_len, NULL, 0, &len, err, sizeof err);
    expect(s, MGPU_BUFFER_TOO_SMALL, "prepare size", err);
    unsigned char *launch = malloc(len);
    size_t cap = len;
    expect(mgpu_prepare(h, id, id_len, config, config_len, launch, cap, &len, err, sizeof err), MGPU_OK,
           "prepare", err);
    spit("launch.bin", launch, len);
    fprintf(stderr, "prepare: %zu bytes of ContainerLaunchInfo\n", len);

    int cmd[2], ack[2];
    if (pipe(cmd) || pipe(ack)) { perror("pipe"); return 1; }
    fflush(stdout);
    pid_t pid = fork();
    if (pid < 0) { perror("fork"); return 1; }
    if (pid == 0) child(cmd[0], ack[1], argc, argv);

    expect(mgpu_isolate(h, id, id_len, pid, err, sizeof err), MGPU_OK, "isolate", err);
    probe(cmd[1], ack[0]);
    expect(mgpu_update(h, id, id_len, update, update_len, err, sizeof err), MGPU_OK, "update", err);
    probe(cmd[1], ack[0]);

    unsigned char out[4096];
    expect(mgpu_usage(h, id, id_len, out, sizeof out, &len, err, sizeof err), MGPU_OK, "usage", err);
    spit("usage.bin", out, len);
    expect(mgpu_status(h, id, id_len, out, sizeof out, &len, err, sizeof err), MGPU_OK, "status", err);
    spit("status.bin", out, len);
    expect(mgpu_watch(h, id, id_len, 0, out, sizeof out, &len, err, sizeof err), MGPU_TIMED_OUT, "watch", err);

    /* cleanup is refused while the child is in the cgroup, then succeeds. */
    s = mgpu_cleanup(h, id, id_len, err, sizeof err);
    expect(s, MGPU_INTERNAL, "cleanup while busy", err);
    fprintf(stderr, "cleanup while busy: %s\n", err);
    if (write(cmd[1], "q", 1) != 1) return 1;
    int status = 0;
    waitpid(pid, &status, 0);
    expect(mgpu_cleanup(h, id, id_len, err, sizeof err), MGPU_OK, "cleanup", err);
    expect(mgpu_status(h, id, id_len, out, sizeof out, &len, err, sizeof err), MGPU_UNKNOWN_CONTAINER,
           "status after cleanup", err);

    mgpu_isolator_free(h);
    mgpu_isolator_free(NULL);
    free(launch); free(params); free(id); free(config); free(update); free(recover);
    fprintf(stderr, "lifecycle done\n");
    return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : 1;
}
