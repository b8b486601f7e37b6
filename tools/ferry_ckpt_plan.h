/*
 * The checkpoint interval (`ferry ckpt plan`): Young's and Daly's optimum intervals and the
 * expected fraction of a run lost to saving checkpoints and to failures (docs/CHECKPOINTS.md,
 * "Choosing the checkpoint interval", gives the model and its sources). Pure arithmetic, in seconds.
 */
#ifndef FERRY_CKPT_PLAN_H
#define FERRY_CKPT_PLAN_H

#ifdef __cplusplus
extern "C" {
#endif

/* M, the job's mean time between failures: a node's MTBF in hours over the number of nodes. */
double ferry_ckpt_plan_mtbf_s(double node_mtbf_h, double nodes);
/* Young (1974): sqrt(2 C M). */
double ferry_ckpt_plan_young(double c, double m);
/*
 * Daly (2006), eq. 37: sqrt(2 C M) (1 + sqrt(C / 2M) / 3 + C / 18M) - C for C < 2M, else M.
 * The interval is compute time between the ends of two checkpoints' saves.
 */
double ferry_ckpt_plan_daly(double c, double m);

/* The expected loss at an interval, as fractions of the run's useful compute time. */
struct ferry_ckpt_loss {
	double ckpt;    /* time blocked saving: C / tau */
	double failure; /* rework and restarts: (tau + C) / 2M + R / M */
	double total;
};
/*
 * First-order model: per interval of work tau, one save blocks C; a failure (rate 1/M) loses on
 * average half of the tau + C since the last completed checkpoint, plus the restart R. rollback is
 * the C in (tau + C) / 2M: the save's whole duration S for an asynchronous save (its state is not on
 * disk until it ends), C otherwise. Returns -1 when tau, m are not above 0 or c, r, rollback below 0.
 */
int ferry_ckpt_plan_loss(double tau, double c, double rollback, double r, double m, struct ferry_ckpt_loss *out);

/*
 * Reads the numbers of `ferry ckpt bench --json` from text (one flat JSON object): save_s (> 0),
 * and async_blocked_s, async_total_s (0 when absent). Returns 0, or -1 with a sentence in why.
 */
int ferry_ckpt_plan_from_bench(const char *text, double *save_s, double *async_blocked_s, double *async_total_s,
			       char *why, unsigned long len);

#ifdef __cplusplus
}
#endif
#endif
