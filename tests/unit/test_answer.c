/*
 * test_answer.c - the one shape of a resource's answer (lib/answer.c), table-driven: each
 * kind of body becomes the documented JSON (value, text or base64, content_type, the
 * truncated flag), and every seed of the fuzz corpus (tests/fuzz/corpus/answer, the
 * fuzz target's input format) reads back as stored, as the store reads it.
 */
#include "unit.h"

#include <dirent.h>
#include <stdio.h>

static const struct {
	const char *name;
	const char *body;
	size_t len;
	int truncated;
	const char *content_type;
	const char *want; /* the whole answer, compact JSON */
} cases[] = {
    {"empty", "", 0, 0, NULL, "{\"status\":200,\"content_type\":null,\"body\":\"\"}"},
    {"json", "{\"a\":[1,2]}", 11, 0, "application/json",
     "{\"status\":200,\"content_type\":\"application/json\",\"body\":{\"a\":[1,2]}}"},
    {"json scalar", " 42 ", 4, 0, "text/plain",
     "{\"status\":200,\"content_type\":\"text/plain\",\"body\":42}"},
    {"text", "h\xc3\xa9llo\r\n\tok", 11, 0, NULL,
     "{\"status\":200,\"content_type\":null,\"body\":\"h\xc3\xa9llo\\r\\n\\tok\"}"},
    {"cut json is text", "{\"a\":1", 6, 1, NULL,
     "{\"status\":200,\"content_type\":null,\"body\":\"{\\\"a\\\":1\",\"truncated\":true}"},
    {"cut inside a character", "ab\xe2\x82", 4, 1, NULL,
     "{\"status\":200,\"content_type\":null,\"body\":\"ab\",\"truncated\":true}"},
    {"latin-1", "caf\xe9", 4, 0, NULL,
     "{\"status\":200,\"content_type\":null,\"body\":\"Y2Fm6Q==\",\"encoding\":\"base64\"}"},
    {"NUL", "a\0b", 3, 0, NULL,
     "{\"status\":200,\"content_type\":null,\"body\":\"YQBi\",\"encoding\":\"base64\"}"},
    {"escaped NUL in JSON", "\"\\u0000\"", 8, 0, NULL,
     "{\"status\":200,\"content_type\":null,\"body\":\"\\\"\\\\u0000\\\"\"}"},
    {"control character", "a\x1b", 2, 0, NULL,
     "{\"status\":200,\"content_type\":null,\"body\":\"YRs=\",\"encoding\":\"base64\"}"},
    {"surrogate", "\xed\xa0\x80", 3, 0, NULL,
     "{\"status\":200,\"content_type\":null,\"body\":\"7aCA\",\"encoding\":\"base64\"}"},
    {"cut binary", "\xff\xfe\xfd", 3, 1, "application/octet-stream",
     "{\"status\":200,\"content_type\":\"application/octet-stream\",\"body\":\"//79\","
     "\"encoding\":\"base64\",\"truncated\":true}"},
    {"odd Content-Type", "x", 1, 0, "text/\xff\x01",
     "{\"status\":200,\"content_type\":\"text/??\",\"body\":\"x\"}"},
};

static void test_answer_shapes(void **state)
{
	(void)state;
	for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
		json_t *a = answer_json(200, cases[i].content_type, cases[i].body, cases[i].len,
					cases[i].truncated);
		assert_non_null(a);
		json_t *want = js(cases[i].want);
		if (!json_equal(a, want)) {
			char *got = json_dumps(a, JSON_COMPACT);
			fail_msg("%s: got %s", cases[i].name, got ? got : "(not dumpable)");
		}
		json_decref(want);
		json_decref(a);
	}
}

/* One corpus file, as fuzz_answer reads it: flags byte, [Content-Type "\n"], body. */
static void round_trip(const char *path)
{
	FILE *f = fopen(path, "rb");
	assert_non_null(f);
	char buf[4096];
	size_t n = fread(buf, 1, sizeof buf, f);
	fclose(f);
	assert_true(n >= 1);
	const char *p = buf + 1, *ct = NULL;
	size_t len = n - 1;
	char ctbuf[sizeof buf];
	if (buf[0] & 2) {
		const char *nl = memchr(p, '\n', len);
		size_t cl = nl ? (size_t)(nl - p) : len;
		memcpy(ctbuf, p, cl);
		ctbuf[cl] = 0;
		ct = ctbuf;
		p += nl ? cl + 1 : cl;
		len -= nl ? cl + 1 : cl;
	}
	json_t *a = answer_json(200, ct, p, len, buf[0] & 1);
	char *text = a ? json_dumps(a, JSON_COMPACT) : NULL;
	json_t *back = text ? json_loads(text, JSON_DECODE_ANY, NULL) : NULL;
	if (!back || !json_equal(a, back))
		fail_msg("%s does not read back as stored", path);
	json_decref(back);
	free(text);
	json_decref(a);
}

static void test_corpus_reads_back(void **state)
{
	(void)state;
	static const char dir[] = "tests/fuzz/corpus/answer";
	DIR *d = opendir(dir);
	if (!d)
		fail_msg("%s is missing (run from the repository root)", dir);
	size_t seen = 0;
	struct dirent *e;
	while ((e = readdir(d))) {
		if (e->d_name[0] == '.')
			continue;
		char path[512];
		snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
		round_trip(path);
		seen++;
	}
	closedir(d);
	assert_true(seen >= 10);
}

static void test_utf8_trim(void **state)
{
	(void)state;
	char a[] = "HTTP 404 from http://x/\xc3", b[] = "ok \xe2\x82\xac", c[] = "\xe2\x82";
	utf8_trim(a);
	utf8_trim(b);
	utf8_trim(c);
	assert_string_equal(a, "HTTP 404 from http://x/");
	assert_string_equal(b, "ok \xe2\x82\xac");
	assert_string_equal(c, "");
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_answer_shapes),
	    cmocka_unit_test(test_corpus_reads_back),
	    cmocka_unit_test(test_utf8_trim),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
