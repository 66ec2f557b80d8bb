/*
 * ckpt_lock — one run at a time on a checkpoint directory (issue 46; see
 * ckpt_lock_dir in ckpt.h). Local file system work only: rank 0 calls it.
 *
 * The lock is an exclusive flock on DIR/.shardlm.lock, held by an open file
 * description that lives as long as the process: the kernel drops it when
 * the process ends, however it ends (kill -9, a lost node's processes), so
 * a killed run never leaves a lock to clean up. The file itself stays (it is
 * never unlinked: removing a lock file races with a run that just opened it)
 * and holds one line naming the holder, for the message a second run gives.
 *
 * Shared file systems. flock(2) on Linux:
 *   - NFS: the client turns flock into a whole-file POSIX lock served by the
 *     server's lock manager (NLM for v3, the protocol itself for v4), so it
 *     holds across nodes; a holder's node that dies loses it when its lease
 *     (v4, ~90 s) or the lock manager's recovery runs out.
 *   - Lustre: across nodes with the client mount option `flock`; with
 *     `noflock` (the default before 2.12) the call fails with ENOSYS; with
 *     `localflock` it succeeds but only between processes of one node, which
 *     no program can detect: mount with `flock` where runs of different
 *     nodes can share a checkpoint.dir.
 *   - GPFS / IBM Storage Scale: honoured across the cluster by its token
 *     manager.
 * Where flock is refused (ENOSYS, EOPNOTSUPP, ENOLCK: Lustre's noflock, NFS
 * without a lock manager) the lock is instead the existence of
 * DIR/.shardlm.lock.held, made with O_CREAT|O_EXCL (atomic on every one of
 * these file systems) and holding the same line; the run removes it when it
 * ends (normally or through fail_input). A kill -9 leaves it: the next run on
 * the same host takes it over when the recorded process is gone; from another
 * host it cannot tell, so it refuses naming the file to remove.
 * SHARDLM_TEST_NO_FLOCK=1 takes this path on any file system (tests).
 */
#include "ckpt_internal.h"
#include "core/util.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <time.h>
#include <unistd.h>

#define LOCK_NAME ".shardlm.lock"
#define HELD_NAME ".shardlm.lock.held"

/* The held file of the fallback, removed at a normal exit (atexit) */
static char g_held_path[CKPT_MAX_PATH];

static void remove_held(void)
{
    if (g_held_path[0])
        unlink(g_held_path);
}

/* "host H pid P[ job J] since TIME": who holds the lock, as the file records it. */
static void holder_line(char *out, size_t cap)
{
    char host[256] = "?", when[64] = "?";
    gethostname(host, sizeof host - 1);
    time_t now = time(NULL);
    struct tm tm;
    if (localtime_r(&now, &tm))
        strftime(when, sizeof when, "%Y-%m-%d %H:%M:%S", &tm);
    const char *job = getenv("SLURM_JOB_ID");
    snprintf(out, cap, "host %s pid %ld%s%s since %s", host, (long)getpid(), job ? " job " : "", job ? job : "",
             when);
}

/* The holder line a file records ("an unknown process" when it is empty). */
static void read_holder(int fd, char *out, size_t cap)
{
    ssize_t n = pread(fd, out, cap - 1, 0);
    out[n > 0 ? n : 0] = 0;
    out[strcspn(out, "\n")] = 0;
    if (!out[0])
        snprintf(out, cap, "an unknown process");
}

static void write_holder(int fd)
{
    char line[512];
    holder_line(line, sizeof line);
    size_t n = strlen(line);
    line[n++] = '\n';
    /* the message of a second run only: a failed write leaves the lock as good */
    if (ftruncate(fd, 0) != 0 || pwrite(fd, line, n, 0) != (ssize_t)n)
        log_warn("cannot record this run in the checkpoint.dir lock file: %s", strerror(errno));
}

/* The holder recorded in an O_EXCL file is a dead process of this host: the file is stale. */
static int held_by_dead_process(const char *holder)
{
    char host[256] = "", recorded[256];
    long pid;
    gethostname(host, sizeof host - 1);
    return sscanf(holder, "host %255s pid %ld", recorded, &pid) == 2 && strcmp(recorded, host) == 0 && pid > 0 &&
           kill((pid_t)pid, 0) != 0 && errno == ESRCH;
}

/* Where flock is not honoured: DIR/.shardlm.lock.held made with O_EXCL. */
static int lock_by_creation(const char *dir, char *why, size_t why_cap)
{
    char path[CKPT_MAX_PATH];
    snprintf(path, sizeof path, "%s/" HELD_NAME, dir);
    for (int attempt = 0; attempt < 2; attempt++) {
        int fd = open(path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
        if (fd >= 0) {
            write_holder(fd);
            close(fd);
            snprintf(g_held_path, sizeof g_held_path, "%s", path);
            util_remove_on_failure(path);
            atexit(remove_held);
            return 0;
        }
        if (errno != EEXIST) {
            snprintf(why, why_cap, "cannot create the lock file '%s' of checkpoint.dir: %s", path, strerror(errno));
            return -1;
        }
        char holder[512] = "";
        fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd >= 0) {
            read_holder(fd, holder, sizeof holder);
            close(fd);
        }
        if (attempt == 0 && held_by_dead_process(holder) && unlink(path) == 0) {
            log_warn("removed '%s', the lock of a run that ended without removing it (%s)", path, holder);
            continue;
        }
        snprintf(why, why_cap,
                 "checkpoint.dir '%s' is in use by another run (%s; lock file '%s', this file system does not honour "
                 "flock): wait for that run to end, or give this run another checkpoint.dir; if that run is gone "
                 "(killed on another node), remove '%s'",
                 dir, holder, path, path);
        return -1;
    }
    return -1;
}

int ckpt_lock_dir(const char *dir, char *why, size_t why_cap)
{
    char path[CKPT_MAX_PATH];
    if (snprintf(path, sizeof path, "%s/" LOCK_NAME, dir) >= (int)sizeof path) {
        snprintf(why, why_cap, "checkpoint.dir '%s' is too long", dir);
        return -1;
    }
    const char *no_flock = getenv("SHARDLM_TEST_NO_FLOCK");
    if (no_flock && strcmp(no_flock, "1") == 0)
        return lock_by_creation(dir, why, why_cap);
    /* never closed: the open file description carries the lock until the process ends */
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) {
        snprintf(why, why_cap, "cannot open the lock file '%s' of checkpoint.dir: %s", path, strerror(errno));
        return -1;
    }
    if (flock(fd, LOCK_EX | LOCK_NB) == 0) {
        write_holder(fd);
        return 0;
    }
    const int err = errno;
    if (err == ENOSYS || err == EOPNOTSUPP || err == ENOLCK) {
        close(fd);
        log_warn("checkpoint.dir '%s': the file system does not honour flock (%s); locking by creating '%s/" HELD_NAME
                 "' instead",
                 dir, strerror(err), dir);
        return lock_by_creation(dir, why, why_cap);
    }
    char holder[512];
    read_holder(fd, holder, sizeof holder);
    close(fd);
    if (err == EWOULDBLOCK)
        snprintf(why, why_cap,
                 "checkpoint.dir '%s' is in use by another run (%s; lock file '%s'): two runs would delete and "
                 "overwrite each other's checkpoints. Hint: wait for that run to end, or give this run another "
                 "checkpoint.dir",
                 dir, holder, path);
    else
        snprintf(why, why_cap, "cannot lock checkpoint.dir '%s' (flock of '%s': %s)", dir, path, strerror(err));
    return -1;
}
