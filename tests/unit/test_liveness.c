/*
 * test_liveness — the probe that names lost ranks (src/comm/liveness.h), with three
 * "ranks" in one process: every responder answers; a stopped one is named and
 * the others still answer; a probe of another job (another token) gets no
 * answer from this job's responders.
 */
#include "check.h"
#include "comm/liveness.h"

#include <string.h>
#include <unistd.h>

enum { WORLD = 3 };
/* A probe returns once every rank has answered, else after its time: the
 * first is long, so that a probe which did not return early shows, the others
 * long enough for a loaded machine's threads to answer. */
#define PROBE_ALL_SECONDS 30.0
#define PROBE_SECONDS 3.0

int main(void)
{
    struct rank_card cards[WORLD];
    struct liveness *ranks[WORLD];
    for (int r = 0; r < WORLD; r++)
        ranks[r] = liveness_start(r, &cards[r]);
    CHECK("card", cards[1].rank == 1 && cards[1].pid == getpid() && cards[1].host[0] && cards[1].n_addrs >= 1 &&
                      cards[1].port != 0 && cards[1].port != cards[2].port,
          "rank %d pid %d host '%s' %d addresses port %u", cards[1].rank, cards[1].pid, cards[1].host,
          cards[1].n_addrs, cards[1].port);
    for (int r = 0; r < WORLD; r++)
        liveness_set_peers(ranks[r], cards, WORLD);

    int answered[WORLD];
    double t0 = now_seconds();
    int missing = liveness_probe(ranks[0], PROBE_ALL_SECONDS, answered);
    double took = now_seconds() - t0;
    CHECK("all_answer", missing == 0 && answered[0] && answered[1] && answered[2] && took < PROBE_ALL_SECONDS,
          "%d missing (%d %d %d) after %.2f s", missing, answered[0], answered[1], answered[2], took);

    liveness_stop(ranks[2]);
    missing = liveness_probe(ranks[1], PROBE_SECONDS, answered);
    CHECK("stopped_rank_named", missing == 1 && answered[0] && answered[1] && !answered[2], "%d missing (%d %d %d)",
          missing, answered[0], answered[1], answered[2]);

    /* Another job whose rank 1 is at this job's rank 1's address and port: its
     * token differs, so that responder ignores the pings. */
    struct rank_card other[2];
    struct liveness *stranger = liveness_start(0, &other[0]);
    other[1] = cards[1];
    liveness_set_peers(stranger, other, 2);
    int other_answered[2];
    missing = liveness_probe(stranger, PROBE_SECONDS, other_answered);
    CHECK("other_job_ignored", missing == 1 && other_answered[0] && !other_answered[1], "%d missing (%d %d)", missing,
          other_answered[0], other_answered[1]);

    liveness_stop(stranger);
    liveness_stop(ranks[0]);
    liveness_stop(ranks[1]);
    return check_status();
}
