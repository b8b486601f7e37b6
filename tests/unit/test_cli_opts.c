/* The CLI's option parser (cli/opts.c): every kind of row, both spellings, short letters,
 * positional arguments, and the one-line errors and generated help every subcommand shares. */
#include "ferry_test.h"

#include "../../cli/opts.c"

struct t_opts {
	const char *str, *word, *opt;
	int flag, other, choice, i, optchoice;
	unsigned u;
	uint64_t u64, size;
	double d, t;
	int func_seen;
};

static const char *set_even(void *opts, const char *val)
{
	struct t_opts *o = opts;
	if (strcmp(val, "2") && strcmp(val, "4"))
		return "an even number below 5";
	o->func_seen = val[0] - '0';
	return NULL;
}

static const struct cli_choice colours[] = {{"red", 1, 0}, {"green", 2, 0}, {"blue", 3, 0}, {"0", 0, 1}, {NULL, 0, 0}};
static const struct cli_choice words[] = {{"alpha", 0, 0}, {"beta", 0, 0}, {NULL, 0, 0}};

#define O(f) offsetof(struct t_opts, f)

static const struct cli_opt rows[] = {
	{.name = "str", .letter = 's', .kind = CLI_STR, .off = O(str), .arg = "S", .help = "a string"},
	{.name = "word", .kind = CLI_STR, .off = O(word), .choices = words, .help = "a word"},
	{.name = "flag", .letter = 'f', .kind = CLI_FLAG, .off = O(flag), .help = "a flag"},
	{.name = "other", .letter = 'g', .kind = CLI_FLAG, .off = O(other), .help = "another flag"},
	{.name = "other-spelling", .kind = CLI_FLAG, .off = O(other), .flags = CLI_HIDDEN},
	{.name = "colour", .kind = CLI_CHOICE, .off = O(choice), .choices = colours, .help = "a colour"},
	{.name = "int", .letter = 'i', .kind = CLI_INT, .off = O(i), .arg = "N", .min = -5, .max = 5, .help = "an int"},
	{.name = "uint", .kind = CLI_UINT, .off = O(u), .arg = "N", .min = 1, .max = 65536, .help = "a count"},
	{.name = "u64", .kind = CLI_U64, .off = O(u64), .arg = "N", .help = "any"},
	{.name = "io_size", .kind = CLI_SIZE, .off = O(size), .arg = "SIZE", .min = 1, .help = "bytes"},
	{.name = "ratio", .kind = CLI_DOUBLE, .off = O(d), .arg = "F", .min = 0.05, .max = 10, .help = "a ratio"},
	{.name = "time", .kind = CLI_TIME, .off = O(t), .arg = "T", .help = "a duration"},
	{.name = "even", .kind = CLI_FUNC, .set = set_even, .arg = "E", .help = "parsed by its own function"},
	{.name = "maybe", .kind = CLI_CHOICE, .off = O(optchoice), .choices = colours, .flags = CLI_OPTIONAL,
	 .implicit = "red", .help = "a colour, red when none is given"},
	{.name = "listen", .kind = CLI_STR, .off = O(opt), .arg = "ADDR", .flags = CLI_OPTIONAL, .implicit = "here",
	 .help = "an address, here when none is given\nsecond line"},
	{.name = NULL},
};

static const struct cli_cmd cmd = {
	.name = "test",
	.synopsis = "ferry test [options] ARG...\nferry test --other",
	.about = "About the command.",
	.opts = rows,
	.footer = "The footer.",
	.max_args = 2,
};

static char errbuf[4096];

/* Parses the NULL-terminated words into *o; errbuf holds what went to stderr. */
static int parse_words(struct t_opts *o, struct cli_args *a, char **words_in)
{
	static char *argv[32];
	int argc = 0;
	argv[argc++] = "test";
	while (*words_in)
		argv[argc++] = *words_in++;
	argv[argc] = NULL;
	memset(o, 0, sizeof(*o));
	memset(a, 0, sizeof(*a));
	FILE *err = fmemopen(errbuf, sizeof(errbuf), "w");
	T_ASSERT(err);
	a->err = err;
	a->out = err;
	int rc = cli_parse(&cmd, o, argc, argv, a);
	fclose(err);
	return rc;
}

#define PARSE(o, a, ...) parse_words(o, a, (char *[]){__VA_ARGS__, NULL})

static void check_error(int rc, const char *want)
{
	T_EQ_INT(rc, 2);
	T_EQ_STR(errbuf, want);
}

static void values(void)
{
	struct t_opts o;
	struct cli_args a;
	for (int eq = 0; eq < 2; eq++) {
		int rc = eq ? PARSE(&o, &a, "--str=x y", "--word=beta", "--colour=green", "--int=-3", "--uint=7",
				    "--u64=0x10", "--io_size=4KiB", "--ratio=0.5", "--time=500ms", "--even=4", "--flag")
			    : PARSE(&o, &a, "--str", "x y", "--word", "beta", "--colour", "green", "--int", "-3", "--uint",
				    "7", "--u64", "0x10", "--io_size", "4KiB", "--ratio", "0.5", "--time", "500ms", "--even",
				    "4", "--flag");
		T_EQ_INT(rc, CLI_CONTINUE);
		T_EQ_STR(o.str, "x y");
		T_EQ_STR(o.word, "beta");
		T_EQ_INT(o.choice, 2);
		T_EQ_INT(o.i, -3);
		T_EQ_INT(o.u, 7);
		T_EQ_INT(o.u64, 16);
		T_EQ_INT(o.size, 4096);
		T_CHECK(o.d == 0.5);
		T_CHECK(o.t > 0.4999 && o.t < 0.5001);
		T_EQ_INT(o.func_seen, 4);
		T_EQ_INT(o.flag, 1);
		T_EQ_INT(a.argc, 0);
		T_CHECK(cli_given(&cmd, &a, "int") && cli_given(&cmd, &a, "flag") && !cli_given(&cmd, &a, "other"));
	}
	/* hidden choices are accepted; --flag=0; '-' and '_' alike; a hidden row sets its target */
	T_EQ_INT(PARSE(&o, &a, "--colour=0", "--flag=0", "--io-size", "1m", "--other_spelling"), CLI_CONTINUE);
	T_EQ_INT(o.choice, 0);
	T_EQ_INT(o.flag, 0);
	T_EQ_INT(o.size, 1 << 20);
	T_EQ_INT(o.other, 1);
	T_EQ_INT(cli_parse_size("1.5g", &o.size), 0);
	T_EQ_INT(o.size, 3ull << 29);
	T_EQ_INT(cli_parse_size("1.3k", &o.size), -1);
}

static void letters_and_arguments(void)
{
	struct t_opts o;
	struct cli_args a;
	T_EQ_INT(PARSE(&o, &a, "first", "-sX", "-fg", "-i", "2", "second"), CLI_CONTINUE);
	T_EQ_STR(o.str, "X");
	T_EQ_INT(o.flag, 1);
	T_EQ_INT(o.other, 1);
	T_EQ_INT(o.i, 2);
	T_EQ_INT(a.argc, 2);
	T_EQ_STR(a.argv[0], "first");
	T_EQ_STR(a.argv[1], "second");
	/* -i-4 is -i with -4; after --, options are arguments; "-" is an argument */
	T_EQ_INT(PARSE(&o, &a, "-fi-4", "--", "--flag"), CLI_CONTINUE);
	T_EQ_INT(o.i, -4);
	T_EQ_INT(a.argc, 1);
	T_EQ_STR(a.argv[0], "--flag");
	T_EQ_INT(PARSE(&o, &a, "-"), CLI_CONTINUE);
	T_EQ_INT(a.argc, 1);
	check_error(PARSE(&o, &a, "a", "b", "c"), "ferry test: unexpected argument 'c' (see 'ferry test --help')\n");

	static const struct cli_cmd needs_path = {.name = "t2", .synopsis = "ferry t2 PATH", .opts = rows,
						  .min_args = 1, .max_args = 1, .args = "PATH"};
	char *argv[] = {"t2", "-f", NULL};
	FILE *err = fmemopen(errbuf, sizeof(errbuf), "w");
	T_ASSERT(err);
	a = (struct cli_args){.err = err};
	T_EQ_INT(cli_parse(&needs_path, &o, 2, argv, &a), 2);
	fclose(err);
	T_EQ_STR(errbuf, "ferry t2: no PATH given (see 'ferry t2 --help')\n");
}

static void optional_values(void)
{
	struct t_opts o;
	struct cli_args a;
	T_EQ_INT(PARSE(&o, &a, "--maybe", "--listen"), CLI_CONTINUE);
	T_EQ_INT(o.optchoice, 1);
	T_EQ_STR(o.opt, "here");
	/* the next word is the value only when it is a shown choice (or, without choices, no option) */
	T_EQ_INT(PARSE(&o, &a, "--maybe", "blue", "--listen", "there"), CLI_CONTINUE);
	T_EQ_INT(o.optchoice, 3);
	T_EQ_STR(o.opt, "there");
	T_EQ_INT(a.argc, 0);
	T_EQ_INT(PARSE(&o, &a, "--maybe", "0", "--listen", "-f"), CLI_CONTINUE);
	T_EQ_INT(o.optchoice, 1);
	T_EQ_STR(o.opt, "here");
	T_EQ_INT(o.flag, 1);
	T_EQ_INT(a.argc, 1);
	T_EQ_INT(PARSE(&o, &a, "--maybe=0"), CLI_CONTINUE);
	T_EQ_INT(o.optchoice, 0);
}

static void errors(void)
{
	struct t_opts o;
	struct cli_args a;
	check_error(PARSE(&o, &a, "--bogus=1"), "ferry test: unknown option '--bogus' (see 'ferry test --help')\n");
	check_error(PARSE(&o, &a, "-z"), "ferry test: unknown option '-z' (see 'ferry test --help')\n");
	check_error(PARSE(&o, &a, "--int"), "ferry test: --int needs a value (N) (see 'ferry test --help')\n");
	check_error(PARSE(&o, &a, "--int", "--flag"), "ferry test: --int needs a value (N) (see 'ferry test --help')\n");
	check_error(PARSE(&o, &a, "-i"), "ferry test: -i needs a value (N) (see 'ferry test --help')\n");
	check_error(PARSE(&o, &a, "--int", "6"),
		    "ferry test: --int expects a whole number from -5 to 5; got '6' (see 'ferry test --help')\n");
	check_error(PARSE(&o, &a, "-i", "x"),
		    "ferry test: -i expects a whole number from -5 to 5; got 'x' (see 'ferry test --help')\n");
	check_error(PARSE(&o, &a, "--uint", "0"),
		    "ferry test: --uint expects a whole number from 1 to 65536; got '0' (see 'ferry test --help')\n");
	check_error(PARSE(&o, &a, "--u64", "-1"),
		    "ferry test: --u64 expects a whole number; got '-1' (see 'ferry test --help')\n");
	check_error(PARSE(&o, &a, "--io_size", "0"),
		    "ferry test: --io_size expects a size above zero such as 4k, 64m or 2g; got '0' (see 'ferry test --help')\n");
	check_error(PARSE(&o, &a, "--ratio", "11"),
		    "ferry test: --ratio expects a number from 0.05 to 10; got '11' (see 'ferry test --help')\n");
	check_error(PARSE(&o, &a, "--time", "soon"),
		    "ferry test: --time expects a duration above zero in seconds (10, 500ms, 2m); got 'soon' "
		    "(see 'ferry test --help')\n");
	check_error(PARSE(&o, &a, "--colour", "0x"),
		    "ferry test: --colour expects red, green or blue; got '0x' (see 'ferry test --help')\n");
	check_error(PARSE(&o, &a, "--maybe=pink"),
		    "ferry test: --maybe expects red, green or blue (or no value); got 'pink' (see 'ferry test --help')\n");
	check_error(PARSE(&o, &a, "--word", "gamma"),
		    "ferry test: --word expects alpha or beta; got 'gamma' (see 'ferry test --help')\n");
	check_error(PARSE(&o, &a, "--str="), "ferry test: --str expects a non-empty value; got '' (see 'ferry test --help')\n");
	check_error(PARSE(&o, &a, "--flag=yes"),
		    "ferry test: --flag expects 0 or 1 (or no value); got 'yes' (see 'ferry test --help')\n");
	check_error(PARSE(&o, &a, "--even", "3"),
		    "ferry test: --even expects an even number below 5; got '3' (see 'ferry test --help')\n");
}

static void help(void)
{
	struct t_opts o;
	struct cli_args a;
	T_EQ_INT(PARSE(&o, &a, "--int", "1", "--help", "--bogus"), 0);
	T_CHECK(!strncmp(errbuf, "usage: ferry test [options] ARG...\n       ferry test --other\n\nAbout the command.\n",
			 strlen("usage: ferry test [options] ARG...\n       ferry test --other\n\nAbout the command.\n")));
	T_CHECK(strstr(errbuf, "\n  -s, --str S                    a string\n"));
	T_CHECK(strstr(errbuf, "\n      --colour red|green|blue    a colour\n"));
	T_CHECK(strstr(errbuf, "\n      --maybe[=red|green|blue]   a colour, red when none is given\n"));
	T_CHECK(strstr(errbuf, "\n      --listen[=ADDR]            an address, here when none is given\n"
			       "                                 second line\n"));
	T_CHECK(strstr(errbuf, "\n  -h, --help                     print this help\n\nThe footer.\n"));
	T_CHECK(!strstr(errbuf, "other-spelling"));
	T_EQ_INT(PARSE(&o, &a, "-h"), 0);
	T_CHECK(!strncmp(errbuf, "usage: ", 7));
}

int main(void)
{
	values();
	letters_and_arguments();
	optional_values();
	errors();
	help();
	return t_result();
}
