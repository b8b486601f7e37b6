/*
 * ferry ckpt plan's arithmetic (tools/ckpt_plan.c) against values worked by hand.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ferry_ckpt_plan.h"
#include "ferry_test.h"

#define T_NEAR(a, b, tol)                                                                              \
	do {                                                                                           \
		double t_a_ = (a), t_b_ = (b);                                                         \
		if (!(fabs(t_a_ - t_b_) <= (tol))) {                                                   \
			fprintf(stderr, "%s:%d: %s == %s failed: %.9g != %.9g\n", __FILE__, __LINE__, #a, \
				#b, t_a_, t_b_);                                                       \
			t_failures++;                                                          \
		}                                                                              \
	} while (0)

int main(void)
{
	/* M = 5000 h * 3600 s/h / 100 nodes = 18,000,000 / 100 = 180,000 s. */
	T_NEAR(ferry_ckpt_plan_mtbf_s(5000, 100), 180000, 1e-9);

	/* C = 2, M = 100: Young sqrt(2*2*100) = sqrt(400) = 20.
	 * Daly: sqrt(C/2M) = sqrt(0.01) = 0.1, /3 = 0.0333333; C/18M = 2/1800 = 0.00111111;
	 * 20 * (1 + 0.0333333 + 0.00111111) - 2 = 20 * 1.0344444 - 2 = 20.688889 - 2 = 18.688889. */
	T_NEAR(ferry_ckpt_plan_young(2, 100), 20, 1e-12);
	T_NEAR(ferry_ckpt_plan_daly(2, 100), 18.688889, 1e-6);

	/* C = 60 s, M = 180,000 s: Young sqrt(2*60*180000) = sqrt(21,600,000) = 4647.5800.
	 * Daly: sqrt(60/360000) = sqrt(1/6000) = 0.01290994, /3 = 0.00430331; 60/(18*180000) =
	 * 60/3,240,000 = 0.0000185185; factor 1.00432183; 4647.5800 * 1.00432183 = 4647.5800 +
	 * 20.0860 = 4667.6660; - 60 = 4607.666. */
	T_NEAR(ferry_ckpt_plan_young(60, 180000), 4647.5800, 1e-3);
	T_NEAR(ferry_ckpt_plan_daly(60, 180000), 4607.666, 2e-3);

	/* C >= 2M: Daly's interval is M. C = 400, M = 200 -> 200; C = 2M exactly -> M. */
	T_NEAR(ferry_ckpt_plan_daly(400, 200), 200, 0);
	T_NEAR(ferry_ckpt_plan_daly(200, 100), 100, 0);

	/* Loss at tau = 20, C = 2, rollback 2, R = 10, M = 100:
	 * saves 2/20 = 0.1; failures (20 + 2)/(2*100) + 10/100 = 0.11 + 0.1 = 0.21; total 0.31. */
	struct ferry_ckpt_loss l;
	T_EQ_INT(ferry_ckpt_plan_loss(20, 2, 2, 10, 100, &l), 0);
	T_NEAR(l.ckpt, 0.1, 1e-12);
	T_NEAR(l.failure, 0.21, 1e-12);
	T_NEAR(l.total, 0.31, 1e-12);
	/* Asynchronous: blocked B = 0.5 in place of C, rollback the save's duration S = 8:
	 * 0.5/20 = 0.025; (20 + 8)/200 + 0.1 = 0.14 + 0.1 = 0.24; total 0.265. */
	T_EQ_INT(ferry_ckpt_plan_loss(20, 0.5, 8, 10, 100, &l), 0);
	T_NEAR(l.ckpt, 0.025, 1e-12);
	T_NEAR(l.failure, 0.24, 1e-12);
	T_NEAR(l.total, 0.265, 1e-12);

	/* Young's interval is where C/tau + tau/2M has its minimum (d/dtau = -C/tau^2 + 1/2M = 0). */
	struct ferry_ckpt_loss lo, at, hi;
	double y = ferry_ckpt_plan_young(60, 180000);
	T_EQ_INT(ferry_ckpt_plan_loss(y, 60, 60, 300, 180000, &at), 0);
	T_EQ_INT(ferry_ckpt_plan_loss(y * 0.9, 60, 60, 300, 180000, &lo), 0);
	T_EQ_INT(ferry_ckpt_plan_loss(y * 1.1, 60, 60, 300, 180000, &hi), 0);
	T_CHECK(at.total < lo.total && at.total < hi.total);

	T_EQ_INT(ferry_ckpt_plan_loss(0, 2, 2, 10, 100, &l), -1);
	T_EQ_INT(ferry_ckpt_plan_loss(20, 2, 2, 10, 0, &l), -1);
	T_EQ_INT(ferry_ckpt_plan_loss(20, -1, 2, 10, 100, &l), -1);

	/* The bench's JSON: top-level keys only (a nested "save_s" is someone else's). */
	double s, b, t;
	char why[200];
	T_EQ_INT(ferry_ckpt_plan_from_bench("{\"bytes\":1,\"x\":{\"save_s\":9},\"name\":\"save_s\",\"save_s\":1.25,"
					    "\"async_blocked_s\":0.0500,\"async_total_s\":1.5}",
					    &s, &b, &t, why, sizeof(why)),
		 0);
	T_NEAR(s, 1.25, 0);
	T_NEAR(b, 0.05, 0);
	T_NEAR(t, 1.5, 0);
	T_EQ_INT(ferry_ckpt_plan_from_bench("{\"save_s\":2}", &s, &b, &t, why, sizeof(why)), 0);
	T_NEAR(s, 2, 0);
	T_NEAR(b, 0, 0);
	T_EQ_INT(ferry_ckpt_plan_from_bench("{\"x\":{\"save_s\":9}}", &s, &b, &t, why, sizeof(why)), -1);
	T_CHECK(strstr(why, "\"save_s\" is missing") != NULL);
	T_EQ_INT(ferry_ckpt_plan_from_bench("{\"save_s\":\"fast\"}", &s, &b, &t, why, sizeof(why)), -1);
	T_CHECK(strstr(why, "not a number") != NULL);
	T_EQ_INT(ferry_ckpt_plan_from_bench("{\"save_s\":0}", &s, &b, &t, why, sizeof(why)), -1);
	T_EQ_INT(ferry_ckpt_plan_from_bench("TABLE ferry save", &s, &b, &t, why, sizeof(why)), -1);
	T_CHECK(strstr(why, "not a JSON object") != NULL);
	return t_result();
}
