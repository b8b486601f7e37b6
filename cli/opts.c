/* The one option parser of the ferry CLI (cli/opts.h). */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "opts.h"

static FILE *err_of(const struct cli_args *a)
{
	return a && a->err ? a->err : stderr;
}

int cli_usage_error(const struct cli_cmd *cmd, const struct cli_args *a, const char *fmt, ...)
{
	FILE *err = err_of(a);
	va_list ap;
	va_start(ap, fmt);
	fprintf(err, "ferry %s: ", cmd->name);
	vfprintf(err, fmt, ap);
	fprintf(err, " (see 'ferry %s --help')\n", cmd->name);
	va_end(ap);
	return 2;
}

int cli_parse_size(const char *s, uint64_t *out)
{
	char *end;
	errno = 0;
	if (!*s || *s == '-' || *s == '+')
		return -1;
	double v = strtod(s, &end);
	if (errno || end == s || v < 0)
		return -1;
	double mul = 1;
	if (*end) {
		const char *units = "kmgtp";
		const char *u = strchr(units, (char)(*end | 0x20));
		if (u) {
			mul = pow(1024, (double)(u - units + 1));
			end++;
			if (*end == 'i' || *end == 'I')
				end++;
			if (*end == 'b' || *end == 'B')
				end++;
		} else if (*end == 'b' || *end == 'B') {
			end++;
		}
	}
	if (*end)
		return -1;
	double b = v * mul;
	if (b >= 18446744073709551615.0 || b != floor(b))
		return -1;
	*out = (uint64_t)b;
	return 0;
}

static int parse_u64(const char *s, uint64_t *out)
{
	char *end;
	if (!*s || *s == '-' || *s == '+')
		return -1;
	errno = 0;
	unsigned long long v = strtoull(s, &end, 0);
	if (errno || *end)
		return -1;
	*out = v;
	return 0;
}

static int parse_i64(const char *s, long long *out)
{
	char *end;
	if (!*s)
		return -1;
	errno = 0;
	long long v = strtoll(s, &end, 10);
	if (errno || *end)
		return -1;
	*out = v;
	return 0;
}

static int parse_time(const char *s, double *out)
{
	char *end;
	errno = 0;
	double v = strtod(s, &end);
	if (errno || end == s || !(v > 0) || isinf(v))
		return -1;
	if (!*end || !strcmp(end, "s"))
		*out = v;
	else if (!strcmp(end, "ms"))
		*out = v / 1e3;
	else if (!strcmp(end, "us"))
		*out = v / 1e6;
	else if (!strcmp(end, "m"))
		*out = v * 60;
	else if (!strcmp(end, "h"))
		*out = v * 3600;
	else
		return -1;
	return 0;
}

/* The shown choices: "a, b or c" for errors, "a|b|c" for --help. */
static void choice_list(const struct cli_choice *c, const char *sep, const char *last, char *buf, size_t len)
{
	size_t n = 0, k = 0, used = 0;
	for (const struct cli_choice *x = c; x->name; x++)
		n += !x->hidden;
	buf[0] = '\0';
	for (const struct cli_choice *x = c; x->name && used < len; x++) {
		if (x->hidden)
			continue;
		k++;
		int w = snprintf(buf + used, len - used, "%s%s", k == 1 ? "" : k == n ? last : sep, x->name);
		used += w > 0 ? (size_t)w : 0;
	}
}

static const struct cli_choice *find_choice(const struct cli_choice *c, const char *val, int shown_only)
{
	for (; c && c->name; c++)
		if (!strcmp(c->name, val) && !(shown_only && c->hidden))
			return c;
	return NULL;
}

/* What a row's value should be, for its error: "a whole number from 1 to 65536". */
static void expected(const struct cli_opt *o, char *buf, size_t len)
{
	switch (o->kind) {
	case CLI_FLAG:
		snprintf(buf, len, "0 or 1 (or no value)");
		return;
	case CLI_STR:
	case CLI_CHOICE:
		if (o->choices) {
			choice_list(o->choices, ", ", " or ", buf, len);
			if (o->flags & CLI_OPTIONAL)
				snprintf(buf + strlen(buf), len - strlen(buf), " (or no value)");
		} else {
			snprintf(buf, len, "a non-empty value");
		}
		return;
	case CLI_INT:
	case CLI_UINT:
	case CLI_U64:
		if (o->max > o->min)
			snprintf(buf, len, "a whole number from %.0f to %.0f", o->min, o->max);
		else if (o->min > 0)
			snprintf(buf, len, "a whole number from %.0f", o->min);
		else
			snprintf(buf, len, "a whole number");
		return;
	case CLI_SIZE:
		snprintf(buf, len, "a size%s such as 4k, 64m or 2g", o->min > 0 ? " above zero" : "");
		return;
	case CLI_DOUBLE:
		snprintf(buf, len, "a number from %g to %g", o->min, o->max);
		return;
	case CLI_TIME:
		snprintf(buf, len, "a duration above zero in seconds (10, 500ms, 2m)");
		return;
	case CLI_FUNC:
		buf[0] = '\0';
		return;
	}
}

static int in_range(const struct cli_opt *o, double v)
{
	return v >= o->min && (o->max <= o->min || v <= o->max);
}

/* 0, or -1 when val is not what the row takes. */
static int set_value(const struct cli_opt *o, void *opts, const char *val, const char **why)
{
	void *p = (char *)opts + o->off;
	const struct cli_choice *c;
	uint64_t u;
	long long i;
	double d;
	char *end;
	switch (o->kind) {
	case CLI_FLAG:
		if (strcmp(val, "0") && strcmp(val, "1"))
			return -1;
		*(int *)p = val[0] == '1';
		return 0;
	case CLI_STR:
		if (!*val || (o->choices && !find_choice(o->choices, val, 0)))
			return -1;
		*(const char **)p = val;
		return 0;
	case CLI_CHOICE:
		if (!(c = find_choice(o->choices, val, 0)))
			return -1;
		*(int *)p = c->value;
		return 0;
	case CLI_INT:
		if (parse_i64(val, &i) || !in_range(o, (double)i) || i < INT_MIN || i > INT_MAX)
			return -1;
		*(int *)p = (int)i;
		return 0;
	case CLI_UINT:
	case CLI_U64:
		if (parse_u64(val, &u) || !in_range(o, (double)u) || (o->kind == CLI_UINT && u > UINT_MAX))
			return -1;
		if (o->kind == CLI_UINT)
			*(unsigned *)p = (unsigned)u;
		else
			*(uint64_t *)p = u;
		return 0;
	case CLI_SIZE:
		if (cli_parse_size(val, &u) || !in_range(o, (double)u))
			return -1;
		*(uint64_t *)p = u;
		return 0;
	case CLI_DOUBLE:
		errno = 0;
		d = strtod(val, &end);
		if (errno || end == val || *end || !in_range(o, d))
			return -1;
		*(double *)p = d;
		return 0;
	case CLI_TIME:
		return parse_time(val, (double *)p);
	case CLI_FUNC:
		*why = o->set(opts, val);
		return *why ? -1 : 0;
	}
	return -1;
}

/* Long names match with '-' and '_' the same. */
static int name_is(const char *name, const char *s, size_t n)
{
	size_t k = 0;
	for (; k < n && name[k]; k++)
		if (name[k] != s[k] && !((name[k] == '-' || name[k] == '_') && (s[k] == '-' || s[k] == '_')))
			return 0;
	return k == n && !name[k];
}

/* "--name" or "-c", as errors call a row. */
static const char *spelled(const struct cli_opt *o, int as_letter, char *buf, size_t len)
{
	if (as_letter)
		snprintf(buf, len, "-%c", o->letter);
	else
		snprintf(buf, len, "--%s", o->name);
	return buf;
}

/* Row k given with val (NULL: none could be found): marks it seen and sets its target. */
static int take(const struct cli_cmd *cmd, size_t k, void *opts, const char *val, int as_letter,
		struct cli_args *a)
{
	const struct cli_opt *o = &cmd->opts[k];
	const char *why = NULL;
	char exp[512], nm[80];
	spelled(o, as_letter, nm, sizeof(nm));
	a->seen |= k < 64 ? 1ull << k : 0;
	if (!val)
		return cli_usage_error(cmd, a, "%s needs a value (%s)", nm, o->arg ? o->arg : "");
	if (set_value(o, opts, val, &why) == 0)
		return 0;
	if (why)
		snprintf(exp, sizeof(exp), "%s", why);
	else
		expected(o, exp, sizeof(exp));
	return cli_usage_error(cmd, a, "%s expects %s; got '%s'", nm, exp, val);
}

/* The value of an option given without '=': the next argument, if it is one. */
static const char *next_value(const struct cli_opt *o, int *i, int argc, char **argv)
{
	const char *next = *i + 1 < argc ? argv[*i + 1] : NULL;
	if (o->kind == CLI_FLAG)
		return "1";
	if (o->flags & CLI_OPTIONAL) {
		int takes = next && (o->choices ? find_choice(o->choices, next, 1) != NULL : next[0] != '-');
		if (!takes)
			return o->implicit;
	} else if (!next || !strncmp(next, "--", 2)) {
		return NULL;
	}
	++*i;
	return next;
}

int cli_parse(const struct cli_cmd *cmd, void *opts, int argc, char **argv, struct cli_args *a)
{
	const struct cli_opt *rows = cmd->opts;
	a->seen = 0;
	a->argc = 0;
	a->argv = argv + 1;
	int only_args = 0;
	for (int i = 1; i < argc; i++) {
		const char *s = argv[i];
		if (only_args || s[0] != '-' || !s[1]) {
			if (cmd->max_args >= 0 && a->argc >= cmd->max_args)
				return cli_usage_error(cmd, a, "unexpected argument '%s'%s", s,
						       cmd->max_args ? "" : "; options start with --");
			a->argv[a->argc++] = argv[i];
			continue;
		}
		if (!strcmp(s, "--")) {
			only_args = 1;
			continue;
		}
		if (!strcmp(s, "--help") || !strcmp(s, "-h")) {
			cli_help(cmd, a->out ? a->out : stdout);
			return 0;
		}
		if (s[1] == '-') {
			const char *eq = strchr(s, '=');
			size_t n = eq ? (size_t)(eq - s - 2) : strlen(s + 2);
			size_t k = 0;
			while (rows[k].name && !name_is(rows[k].name, s + 2, n))
				k++;
			if (!rows[k].name)
				return cli_usage_error(cmd, a, "unknown option '%.*s'", (int)(n + 2), s);
			int rc = take(cmd, k, opts, eq ? eq + 1 : next_value(&rows[k], &i, argc, argv), 0, a);
			if (rc)
				return rc;
			continue;
		}
		/* -c, -cVALUE, -c VALUE, or flags together: -ab */
		for (const char *c = s + 1; *c; c++) {
			size_t k = 0;
			while (rows[k].name && rows[k].letter != *c)
				k++;
			const struct cli_opt *o = &rows[k];
			if (!o->name)
				return cli_usage_error(cmd, a, "unknown option '-%c'", *c);
			int rc = take(cmd, k, opts, c[1] && o->kind != CLI_FLAG ? c + 1 : next_value(o, &i, argc, argv), 1, a);
			if (rc)
				return rc;
			if (o->kind != CLI_FLAG)
				break;
		}
	}
	if (a->argc < cmd->min_args)
		return cli_usage_error(cmd, a, "no %s given", cmd->args ? cmd->args : "argument");
	return CLI_CONTINUE;
}

int cli_given(const struct cli_cmd *cmd, const struct cli_args *a, const char *name)
{
	for (size_t k = 0; cmd->opts[k].name; k++)
		if (!strcmp(cmd->opts[k].name, name))
			return !!(a->seen & (1ull << k));
	return 0;
}

/* A row's help; its later lines start under its first. */
static void print_help_text(FILE *out, const char *text)
{
	for (;;) {
		size_t n = strcspn(text, "\n");
		fprintf(out, "%.*s\n", (int)n, text);
		if (!text[n])
			return;
		text += n + 1;
		fprintf(out, "  %-30s ", "");
	}
}

void cli_help(const struct cli_cmd *cmd, FILE *out)
{
	const char *s = cmd->synopsis;
	for (int first = 1; *s; first = 0) {
		size_t n = strcspn(s, "\n");
		fprintf(out, "%s%.*s\n", first ? "usage: " : "       ", (int)n, s);
		s += n + (s[n] == '\n');
	}
	if (cmd->about)
		fprintf(out, "\n%s\n", cmd->about);
	fprintf(out, "\noptions:\n");
	char left[600], list[512];
	for (const struct cli_opt *o = cmd->opts; o->name; o++) {
		if (o->flags & CLI_HIDDEN)
			continue;
		const char *arg = o->arg;
		if (!arg && o->kind != CLI_FLAG && o->choices) {
			choice_list(o->choices, "|", "|", list, sizeof(list));
			arg = list;
		}
		int opt = (o->flags & CLI_OPTIONAL) != 0;
		snprintf(left, sizeof(left), "%s%c%s--%s%s%s%s", o->letter ? "-" : " ", o->letter ? o->letter : ' ',
			 o->letter ? ", " : "  ", o->name, arg ? (opt ? "[=" : " ") : "", arg ? arg : "",
			 arg && opt ? "]" : "");
		if (strlen(left) > 30)
			fprintf(out, "  %s\n  %-30s ", left, "");
		else
			fprintf(out, "  %-30s ", left);
		print_help_text(out, o->help);
	}
	fprintf(out, "  -h, --help                     print this help\n");
	if (cmd->footer)
		fprintf(out, "\n%s\n", cmd->footer);
}

static void list_commands(FILE *out, const char *prog, const struct ferry_cli_command *cmds, const char *about)
{
	fprintf(out, "usage: %s <command> [options]\n\ncommands:\n", prog);
	for (const struct ferry_cli_command *c = cmds; c->name; c++)
		fprintf(out, "  %-10s %s\n", c->name, c->summary);
	fprintf(out, "\n%s%s'%s <command> --help' describes a command's options.\n", about ? about : "",
		about ? "\n" : "", prog);
}

int cli_dispatch(const char *prog, const struct ferry_cli_command *cmds, const char *about, int argc, char **argv)
{
	if (argc < 2) {
		list_commands(stderr, prog, cmds, about);
		return 2;
	}
	if (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help") || !strcmp(argv[1], "help")) {
		list_commands(stdout, prog, cmds, about);
		return 0;
	}
	for (const struct ferry_cli_command *c = cmds; c->name; c++)
		if (!strcmp(argv[1], c->name))
			return c->run(argc - 1, argv + 1);
	fprintf(stderr, "%s: unknown command '%s' (try '%s --help')\n", prog, argv[1], prog);
	return 2;
}
