/*
 * ckpt_dir — the checkpoint directory (see ckpt.h): the step_N.h5 names,
 * creating and checking DIR, publishing a written file (rename, latest,
 * fsyncs), pruning old checkpoints, resolving --resume, and the
 * SHARDLM_CKPT_CRASH test hook that kills a save at its points. Local file
 * system work only: no MPI, no HDF5; the writer (ckpt_write.c) calls it on
 * rank 0 and turns a WHY into the save's agreed error.
 */
#include "ckpt_internal.h"
#include "core/rawio.h"
#include "core/util.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* ------------------------------------------------------------------------ */
/* Names                                                                     */

void ckpt_step_names(const char *dir, long step, struct ckpt_step_names *names)
{
    snprintf(names->name, sizeof names->name, "step_%06ld.h5", step);
    if (snprintf(names->path, sizeof names->path, "%s/%s", dir, names->name) >= (int)sizeof names->path ||
        snprintf(names->tmp_path, sizeof names->tmp_path, "%s.tmp", names->path) >= (int)sizeof names->tmp_path)
        fail_input("checkpoint directory name is too long: '%s'", dir);
}

/* Parses "step_<digits>.h5" exactly; returns the step or -1. */
static long parse_ckpt_name(const char *name)
{
    long step = -1;
    int end = 0;
    if (sscanf(name, "step_%ld.h5%n", &step, &end) == 1 && end > 0 && name[end] == 0 && step >= 0)
        return step;
    return -1;
}

int ckpt_managed_name(const char *name)
{
    if (strcmp(name, "latest") == 0 || strcmp(name, "latest.tmp") == 0)
        return 1;
    char base[256];
    size_t n = strlen(name);
    if (n >= sizeof base)
        return 0;
    memcpy(base, name, n + 1);
    if (n > 4 && strcmp(base + n - 4, ".tmp") == 0)
        base[n - 4] = 0;
    return parse_ckpt_name(base) >= 0;
}

void ckpt_remove_stale_tmp(const char *dir)
{
    DIR *d = opendir(dir);
    struct dirent *e;
    while (d && (e = readdir(d)) != NULL) {
        size_t n = strlen(e->d_name);
        if (n <= 4 || strcmp(e->d_name + n - 4, ".tmp") != 0 || !ckpt_managed_name(e->d_name))
            continue;
        char path[CKPT_MAX_PATH];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        if (unlink(path) == 0)
            log_warn("removed '%s', a stale temporary file of a save that did not finish (a rank killed mid-save)",
                     path);
    }
    if (d)
        closedir(d);
}

/* ------------------------------------------------------------------------ */
/* Creating and checking                                                     */

int ckpt_make_dir(const char *dir, char *why, size_t why_cap)
{
    char buf[CKPT_MAX_PATH];
    if (!dir[0]) {
        snprintf(why, why_cap, "the checkpoint directory is empty");
        return -1;
    }
    snprintf(buf, sizeof buf, "%s", dir);
    for (char *p = buf + 1;; p++) {
        if (*p == '/' || *p == 0) {
            char saved = *p;
            *p = 0;
            if (mkdir(buf, 0777) != 0 && errno != EEXIST) {
                snprintf(why, why_cap, "cannot create directory '%s': %s", buf, strerror(errno));
                return -1;
            }
            *p = saved;
            if (saved == 0)
                break;
        }
    }
    struct stat st;
    if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode)) {
        snprintf(why, why_cap, "'%s' is not a directory: %s", dir, strerror(errno ? errno : ENOTDIR));
        return -1;
    }
    return 0;
}

int ckpt_check_dir(const char *dir, char *why, size_t why_cap)
{
    char err[CKPT_ERROR_CAP];
    if (ckpt_make_dir(dir, err, sizeof err) != 0) {
        snprintf(why, why_cap, "checkpoint.dir: %s", err);
        return -1;
    }
    /* access(W_OK) would trust the mode bits; a read-only mount only shows in
     * a real creation */
    char probe[CKPT_MAX_PATH];
    if (snprintf(probe, sizeof probe, "%s/.shardlm-write-test.%ld", dir, (long)getpid()) >= (int)sizeof probe) {
        snprintf(why, why_cap, "checkpoint.dir '%s' is too long", dir);
        return -1;
    }
    int fd = open(probe, O_WRONLY | O_CREAT | O_EXCL, 0644);
    if (fd < 0) {
        snprintf(why, why_cap, "checkpoint.dir '%s' is not writable: cannot create a file there (%s)", dir,
                 strerror(errno));
        return -1;
    }
    close(fd);
    unlink(probe);
    return 0;
}

/* ------------------------------------------------------------------------ */
/* Saving: crash points, publishing, pruning                                 */

/* Test hook (see ckpt.h): SHARDLM_CKPT_CRASH=POINT[:RANK] kills that rank
 * (default 0) with SIGKILL at POINT of the next save of this process. */
static const char *const crash_names[] = {"before_data", "mid_data", "before_rename", "before_latest"};

int ckpt_crash_armed(int rank)
{
    static bool used;
    const char *spec = getenv("SHARDLM_CKPT_CRASH");
    if (used || !spec || !spec[0])
        return CRASH_NONE;
    used = true;
    int point = CRASH_NONE;
    for (int i = 0; i < (int)(sizeof crash_names / sizeof crash_names[0]); i++) {
        size_t n = strlen(crash_names[i]);
        if (strncmp(spec, crash_names[i], n) == 0 && (spec[n] == 0 || spec[n] == ':'))
            point = i;
    }
    if (point == CRASH_NONE)
        fail_input("SHARDLM_CKPT_CRASH='%s': want before_data, mid_data, before_rename or before_latest, "
                   "optionally :RANK",
                   spec);
    const char *colon = strchr(spec, ':');
    int target = colon ? atoi(colon + 1) : 0;
    return target == rank ? point : CRASH_NONE;
}

void ckpt_crash_reached(const struct ckpt_crash *crash, int point)
{
    if (crash->armed != point)
        return;
    fprintf(stderr, "shardlm: rank %d: SHARDLM_CKPT_CRASH: killing myself at %s of '%s'\n", crash->rank,
            crash_names[point], crash->path);
    fflush(stderr);
    raise(SIGKILL);
}

/* Temp -> final name, then latest -> final name, each made durable. */
int ckpt_publish(const struct ckpt_crash *crash, const char *dir, const struct ckpt_step_names *names, char *why,
                 size_t why_cap)
{
    if (rename(names->tmp_path, names->path) != 0) {
        snprintf(why, why_cap, "cannot rename '%s' to '%s': %s", names->tmp_path, names->path, strerror(errno));
        return -1;
    }
    if (rawio_fsync(dir, true, why, why_cap) != 0)
        return -1;
    ckpt_crash_reached(crash, CRASH_BEFORE_LATEST);
    char latest[CKPT_MAX_PATH], latest_tmp[CKPT_MAX_PATH];
    snprintf(latest, sizeof latest, "%s/latest", dir);
    snprintf(latest_tmp, sizeof latest_tmp, "%s/latest.tmp", dir);
    FILE *fp = fopen(latest_tmp, "w");
    if (!fp || fprintf(fp, "%s\n", names->name) < 0 || fflush(fp) != 0 || fsync(fileno(fp)) != 0) {
        snprintf(why, why_cap, "cannot write '%s': %s", latest_tmp, strerror(errno));
        if (fp)
            fclose(fp);
        unlink(latest_tmp);
        return -1;
    }
    if (fclose(fp) != 0) {
        snprintf(why, why_cap, "cannot close '%s': %s", latest_tmp, strerror(errno));
        unlink(latest_tmp);
        return -1;
    }
    if (rename(latest_tmp, latest) != 0) {
        snprintf(why, why_cap, "cannot rename '%s' to '%s': %s", latest_tmp, latest, strerror(errno));
        unlink(latest_tmp);
        return -1;
    }
    return rawio_fsync(dir, true, why, why_cap);
}

static int compare_desc(const void *a, const void *b)
{
    long x = *(const long *)a, y = *(const long *)b;
    return x < y ? 1 : x > y ? -1 : 0;
}

void ckpt_prune(const char *dir, int keep, long current)
{
    if (keep <= 0)
        return;
    DIR *d = opendir(dir);
    if (!d) {
        log_warn("checkpoint: cannot list '%s' to prune old checkpoints: %s", dir, strerror(errno));
        return;
    }
    size_t n = 0, cap = 16;
    long *steps = xmalloc(cap * sizeof *steps);
    for (struct dirent *e; (e = readdir(d));) {
        long step = parse_ckpt_name(e->d_name);
        if (step < 0)
            continue;
        if (n == cap) {
            cap *= 2;
            long *grown = realloc(steps, cap * sizeof *steps);
            if (!grown)
                fail_internal("out of host memory listing checkpoints");
            steps = grown;
        }
        steps[n++] = step;
    }
    closedir(d);
    qsort(steps, n, sizeof *steps, compare_desc);
    for (size_t i = (size_t)keep; i < n; i++) {
        if (steps[i] == current)
            continue;
        char path[CKPT_MAX_PATH];
        snprintf(path, sizeof path, "%s/step_%06ld.h5", dir, steps[i]);
        if (unlink(path) != 0)
            log_warn("checkpoint: cannot delete old checkpoint '%s': %s", path, strerror(errno));
    }
    free(steps);
}

/* ------------------------------------------------------------------------ */
/* Resolving                                                                 */

/* The checkpoints DIR holds (step_N.h5, published ones only), for the message
 * of a refused --resume auto: "step_000020.h5, step_000010.h5 (2 in all)",
 * newest first, at most CKPT_LIST_SHOWN named. Empty when there are none. */
#define CKPT_LIST_SHOWN 3
static void list_checkpoints(const char *dir, char *out, size_t cap, char *newest, size_t newest_cap)
{
    out[0] = newest[0] = 0;
    DIR *d = opendir(dir);
    if (!d)
        return;
    long steps[CKPT_LIST_SHOWN];
    int count = 0, shown = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        long step = parse_ckpt_name(e->d_name);
        if (step < 0)
            continue;
        count++;
        /* keep the CKPT_LIST_SHOWN largest steps, in descending order */
        if (shown < CKPT_LIST_SHOWN)
            steps[shown++] = step;
        else if (step > steps[shown - 1])
            steps[shown - 1] = step;
        else
            continue;
        for (int i = shown - 1; i > 0 && steps[i] > steps[i - 1]; i--) {
            long t = steps[i];
            steps[i] = steps[i - 1];
            steps[i - 1] = t;
        }
    }
    closedir(d);
    size_t used = 0;
    for (int i = 0; i < shown && used < cap; i++)
        used += (size_t)snprintf(out + used, cap - used, "%sstep_%06ld.h5", i ? ", " : "", steps[i]);
    if (count > 0 && used < cap)
        snprintf(out + used, cap - used, " (%d in all)", count);
    if (count > 0)
        snprintf(newest, newest_cap, "%s/step_%06ld.h5", dir, steps[0]);
}

long ckpt_dir_checkpoints(const char *dir, char *list, size_t list_cap)
{
    char newest[CKPT_MAX_PATH];
    list_checkpoints(dir, list, list_cap, newest, sizeof newest);
    if (!list[0])
        return -1;
    const char *base = strrchr(newest, '/');
    return parse_ckpt_name(base ? base + 1 : newest);
}

/* Refuses --resume auto in DIR, whose latest is unusable for WHY, when DIR
 * holds checkpoints: starting over would overwrite them (a requeued job would
 * throw its training away). Returns when DIR holds none. */
static void refuse_if_checkpoints(const char *dir, const char *why)
{
    char found[512], newest[CKPT_MAX_PATH];
    list_checkpoints(dir, found, sizeof found, newest, sizeof newest);
    if (!found[0])
        return;
    fail_input("--resume auto: '%s' holds checkpoints (%s) but %s. Hint: resume from one with --resume %s, or "
               "start over with --resume none --overwrite (or an empty checkpoint.dir)",
               dir, found, why, newest);
}

/* The checkpoint DIR/latest names: its file name in DIR (as the trainer
 * writes it) or an absolute path, trailing white space ignored. NULL when
 * latest is absent, unreadable, malformed or names no checkpoint file: then
 * REQUIRED fails, and otherwise (--resume auto) the run refuses when DIR holds
 * checkpoints and starts fresh when it holds none. */
static char *latest_target(const char *dir, bool required)
{
    char latest[CKPT_MAX_PATH], why[3 * CKPT_MAX_PATH + 256];
    snprintf(latest, sizeof latest, "%s/latest", dir);
    char name[CKPT_MAX_PATH + 2] = {0};
    char path[CKPT_MAX_PATH];
    path[0] = 0;
    FILE *fp = fopen(latest, "r");
    char hf_config[CKPT_MAX_PATH + 16];
    snprintf(hf_config, sizeof hf_config, "%s/config.json", dir);
    if (!fp && access(hf_config, F_OK) == 0) {
        snprintf(why, sizeof why, "a Hugging Face model directory (config.json; or a partial export), not a "
                                  "checkpoint directory (no 'latest')");
    } else if (!fp) {
        snprintf(why, sizeof why, "no 'latest' (%s)", strerror(errno));
    } else {
        size_t n = fread(name, 1, sizeof name - 1, fp);
        int more = fgetc(fp) != EOF;
        fclose(fp);
        name[n] = 0;
        while (n > 0 && (name[n - 1] == '\n' || name[n - 1] == '\r' || name[n - 1] == ' ' || name[n - 1] == '\t'))
            name[--n] = 0;
        if (more || n >= CKPT_MAX_PATH)
            snprintf(why, sizeof why, "'%s' is too long to name a checkpoint", latest);
        else if (n == 0 || strlen(name) != n || strchr(name, '\n'))
            snprintf(why, sizeof why, "'%s' is empty or holds more than one line", latest);
        else if (name[0] != '/' && (strchr(name, '/') || !strcmp(name, ".") || !strcmp(name, "..")))
            snprintf(why, sizeof why, "'%s' names '%s', not a file in that directory", latest, name);
        else if ((name[0] == '/' ? snprintf(path, sizeof path, "%s", name)
                                 : snprintf(path, sizeof path, "%s/%s", dir, name)) >= (int)sizeof path)
            snprintf(why, sizeof why, "'%s' names a path too long", latest);
        else {
            struct stat st;
            if (stat(path, &st) != 0)
                snprintf(why, sizeof why, "'%s' names '%s', which is missing (%s)", latest, path, strerror(errno));
            else if (!S_ISREG(st.st_mode))
                snprintf(why, sizeof why, "'%s' names '%s', which is not a checkpoint file", latest, path);
            else
                return xstrdup(path);
        }
    }
    if (required)
        fail_input("%s: %s. Hint: name a step_*.h5 file instead", dir, why);
    refuse_if_checkpoints(dir, why);
    if (fp)
        log_warn("%s, and '%s' holds no checkpoint: starting fresh", why, dir);
    return NULL;
}

/* The directory part of PATH ("." when it has none), into out. */
static void dir_of(const char *path, char *out, size_t cap)
{
    const char *slash = strrchr(path, '/');
    if (!slash)
        snprintf(out, cap, ".");
    else if (slash == path)
        snprintf(out, cap, "/");
    else
        snprintf(out, cap, "%.*s", (int)(slash - path), path);
}

char *ckpt_resolve(const char *dir, const char *spec)
{
    if (!spec || !spec[0])
        fail_input("--resume '': want auto, none, a checkpoint file or its directory");
    if (strcmp(spec, "none") == 0)
        return NULL;
    if (strcmp(spec, "auto") == 0)
        return dir && dir[0] ? latest_target(dir, false) : NULL;
    struct stat st;
    if (stat(spec, &st) == 0 && S_ISDIR(st.st_mode))
        return latest_target(spec, true);
    const char *base = strrchr(spec, '/');
    if (strcmp(base ? base + 1 : spec, "latest") == 0) {
        /* DIR/latest, the pointer file itself: what it names */
        char parent[CKPT_MAX_PATH];
        dir_of(spec, parent, sizeof parent);
        return latest_target(parent, true);
    }
    return xstrdup(spec);
}

