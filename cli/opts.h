/*
 * The options of every ferry subcommand: data rows (fio's parse.h) read by one parser, so that
 * every subcommand accepts the same spellings, gives the same errors and generates its --help.
 *
 * Spellings: --name=value and --name value; -c value and -cvalue for a row with a short letter;
 * flags -a -b or -ab; '-' and '_' are the same in a long name (--io-size is --io_size); "--" ends
 * the options. -h and --help print the help from the rows. A required value is the next argument
 * unless that starts with "--"; an optional value (CLI_OPTIONAL) only follows '=', or is the next
 * argument when that is one of the row's shown choices (or, without choices, not an option).
 */
#ifndef FERRY_CLI_OPTS_H
#define FERRY_CLI_OPTS_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* What a row's value is, and so the type of its target. */
enum cli_kind {
	CLI_FLAG,   /* int: 1 when given; --flag=0 and --flag=1 are accepted too */
	CLI_STR,    /* const char *: non-empty; one of .choices (their names) if it has any */
	CLI_CHOICE, /* int: the value of the choice named */
	CLI_INT,    /* int: a whole number in [min, max] */
	CLI_UINT,   /* unsigned: a whole number in [min, max] */
	CLI_U64,    /* uint64_t: a whole number in [min, max] (max 0: no upper bound) */
	CLI_SIZE,   /* uint64_t: bytes with fio's suffixes (4k, 1m, 2g, 4KiB), in [min, max] (max 0: none) */
	CLI_DOUBLE, /* double: a number in [min, max] */
	CLI_TIME,   /* double: a duration above zero in seconds, or with ms, us, s, m or h */
	CLI_FUNC,   /* .set parses the value itself */
};

enum {
	CLI_OPTIONAL = 1, /* the value may be left out: then it is .implicit */
	CLI_HIDDEN = 2,   /* accepted, not shown in --help (another spelling of a shown row) */
};

struct cli_choice {
	const char *name;
	int value;
	int hidden; /* accepted, but not named in --help or in errors */
};

struct cli_opt {
	const char *name; /* long name, without "--"; NULL ends a table */
	char letter;      /* short option letter, or 0 */
	enum cli_kind kind;
	size_t off;       /* of the target in the options struct given to cli_parse */
	const char *arg;  /* the value's name in --help (NULL for flags) */
	const char *help;
	const struct cli_choice *choices; /* NULL-name terminated */
	double min, max;
	int flags;        /* CLI_OPTIONAL, CLI_HIDDEN */
	const char *implicit; /* CLI_OPTIONAL: the value when none is given */
	/* CLI_FUNC: 0, or what the value should have been ("a size such as 4k"), for the error */
	const char *(*set)(void *opts, const char *val);
};

struct cli_cmd {
	const char *name;     /* as typed after "ferry": "bench", "ckpt bench" */
	const char *synopsis; /* usage lines, each starting with "ferry " */
	const char *about;    /* paragraph(s) between the synopsis and the options; may be NULL */
	const struct cli_opt *opts;
	const char *footer;   /* after the options; may be NULL */
	int min_args;         /* positional arguments required ... */
	int max_args;         /* ... and allowed; -1: any number */
	const char *args;     /* what they are, for the error when too few are given: "PATH" */
};

/* What cli_parse found besides the targets it set. */
struct cli_args {
	uint64_t seen;  /* bit k: opts[k] was given (so a table has at most 64 rows) */
	int argc;       /* the positional arguments, in order, moved to the front of the argv */
	char **argv;    /* given (as getopt permutes it): this is that argv + 1 */
	FILE *out, *err; /* where --help and errors go; NULL: stdout and stderr */
};

/* cli_parse's answer when the command should go on (options good, --help not asked). */
#define CLI_CONTINUE (-1)

/*
 * Parses argv[1..argc) (argv[0] is the command's name) into the struct at opts, which holds the
 * defaults. Returns CLI_CONTINUE, or the exit status the command returns now: 0 after --help, 2
 * after one line on err naming the option and what was expected.
 */
int cli_parse(const struct cli_cmd *cmd, void *opts, int argc, char **argv, struct cli_args *a);
/* 1 if the row with this long name was given. */
int cli_given(const struct cli_cmd *cmd, const struct cli_args *a, const char *name);
/* One line "ferry CMD: ... (see 'ferry CMD --help')" on err; returns 2, the usage exit status. */
int cli_usage_error(const struct cli_cmd *cmd, const struct cli_args *a, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
/* The --help text: synopsis, about, a line per shown row (and -h), footer. */
void cli_help(const struct cli_cmd *cmd, FILE *out);

/* fio's size syntax: 4096, 4k, 4K, 4KiB, 4kb, 1.5g (powers of 1024). 0 or -1. */
int cli_parse_size(const char *s, uint64_t *out);

/* A command of commands ("ferry", "ferry ckpt"): a row per subcommand, NULL-name terminated. */
struct ferry_cli_command {
	const char *name;
	const char *summary;
	int (*run)(int argc, char **argv); /* argv[0] is the subcommand's name */
};
/*
 * Runs the subcommand named by argv[1]. With no argument, prints the list of subcommands on
 * stderr and returns 2; with -h, --help or help, on stdout and returns 0 (about, if not NULL, is a
 * paragraph after the list); an unknown name returns 2 after a line on stderr.
 */
int cli_dispatch(const char *prog, const struct ferry_cli_command *cmds, const char *about, int argc, char **argv);

#endif
