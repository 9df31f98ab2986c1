/*
 * prom.c - a strict parser of the Prometheus text format 0.0.4 and the /metrics checks
 * of the HTTP tests (see prom.h). A family's state while parsing lives in the "families"
 * object itself (members closed and samples, besides type and help).
 */
#include "prom.h"

#include <ctype.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <setjmp.h>
#include <cmocka.h>

static bool all_digits(const char *p)
{
	if (!*p)
		return false;
	for (; *p; p++)
		if (*p < '0' || *p > '9')
			return false;
	return true;
}

/* The state of one parse; the first error goes to err. */
typedef struct expo {
	json_t *families, *samples, *series;
	char current[256];
	int lineno;
	char *err;
	size_t errlen;
} expo;

static int expo_fail(expo *x, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int expo_fail(expo *x, const char *fmt, ...)
{
	int n = snprintf(x->err, x->errlen, "line %d: ", x->lineno);
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(x->err + n, x->errlen - (size_t)n, fmt, ap);
	va_end(ap);
	return -1;
}

static size_t scan_name(const char *p, bool metric)
{
	size_t n = 0;
	while (isalpha((unsigned char)p[n]) || p[n] == '_' || (metric && p[n] == ':') ||
	       (n > 0 && isdigit((unsigned char)p[n])))
		n++;
	return n;
}

static bool valid_float(const char *s)
{
	if (strcmp(s, "NaN") == 0 || strcmp(s, "+Inf") == 0 || strcmp(s, "-Inf") == 0)
		return true;
	const char *p = s;
	size_t digits = 0;
	if (*p == '+' || *p == '-')
		p++;
	for (; isdigit((unsigned char)*p); p++)
		digits++;
	if (*p == '.')
		for (p++; isdigit((unsigned char)*p); p++)
			digits++;
	if (!digits)
		return false;
	if (*p == 'e' || *p == 'E') {
		p++;
		if (*p == '+' || *p == '-')
			p++;
		if (!isdigit((unsigned char)*p))
			return false;
		while (isdigit((unsigned char)*p))
			p++;
	}
	return *p == 0;
}

/* Moves to family `name` (creating it); its lines must not be split by another's. */
static json_t *expo_family(expo *x, const char *name)
{
	json_t *fam = json_object_get(x->families, name);
	if (strcmp(x->current, name) != 0) {
		json_t *prev = json_object_get(x->families, x->current);
		if (prev)
			json_object_set_new(prev, "closed", json_true());
		if (fam && json_is_true(json_object_get(fam, "closed"))) {
			expo_fail(x, "the lines of family %s are not together", name);
			return NULL;
		}
		snprintf(x->current, sizeof x->current, "%s", name);
	}
	if (!fam) {
		fam = json_pack("{s:s, s:b, s:b, s:i}", "type", "", "help", 0, "closed", 0,
				"samples", 0);
		json_object_set_new(x->families, name, fam);
	}
	return fam;
}

static int expo_comment(expo *x, const char *line)
{
	bool help = strncmp(line, "# HELP ", 7) == 0, type = strncmp(line, "# TYPE ", 7) == 0;
	if (!help && !type)
		return 0; /* any other comment is allowed and ignored */
	const char *p = line + 7;
	size_t n = scan_name(p, true);
	if (n == 0 || (p[n] != ' ' && p[n] != 0))
		return expo_fail(x, "bad metric name in \"%s\"", line);
	char name[256];
	snprintf(name, sizeof name, "%.*s", (int)n, p);
	json_t *fam = expo_family(x, name);
	if (!fam)
		return -1;
	if (json_integer_value(json_object_get(fam, "samples")) > 0)
		return expo_fail(x, "%s of %s after its samples", help ? "HELP" : "TYPE", name);
	const char *rest = p[n] ? p + n + 1 : "";
	if (help) {
		if (json_is_true(json_object_get(fam, "help")))
			return expo_fail(x, "second HELP for %s", name);
		for (const char *q = rest; *q; q++)
			if (*q == '\\' && q[1] != '\\' && q[1] != 'n')
				return expo_fail(x, "bad escape in the HELP of %s", name);
			else if (*q == '\\')
				q++;
		json_object_set_new(fam, "help", json_true());
		return 0;
	}
	if (*json_string_value(json_object_get(fam, "type")))
		return expo_fail(x, "second TYPE for %s", name);
	static const char *const types[] = {"counter", "gauge", "histogram", "summary", "untyped"};
	for (size_t i = 0; i < sizeof types / sizeof types[0]; i++)
		if (strcmp(rest, types[i]) == 0) {
			json_object_set_new(fam, "type", json_string(rest));
			return 0;
		}
	return expo_fail(x, "unknown TYPE \"%s\" for %s", rest, name);
}

/* Parses {name="value",...} at *pp into labels; moves *pp past the '}'. */
static int expo_labels(expo *x, const char **pp, json_t *labels)
{
	const char *p = *pp + 1;
	while (*p != '}') {
		size_t n = scan_name(p, false);
		if (n == 0 || p[n] != '=' || p[n + 1] != '"')
			return expo_fail(x, "bad label at \"%.40s\"", p);
		if (n >= 2 && p[0] == '_' && p[1] == '_')
			return expo_fail(x, "reserved label name %.*s", (int)n, p);
		char name[128], value[1024];
		snprintf(name, sizeof name, "%.*s", (int)n, p);
		if (json_object_get(labels, name))
			return expo_fail(x, "label %s twice", name);
		size_t v = 0;
		for (p += n + 2; *p != '"'; p++) {
			if (!*p)
				return expo_fail(x, "unterminated value of label %s", name);
			char c = *p;
			if (c == '\\') {
				p++;
				if (*p != '\\' && *p != '"' && *p != 'n')
					return expo_fail(x, "bad escape in label %s", name);
				c = *p == 'n' ? '\n' : *p;
			}
			if (v + 1 < sizeof value)
				value[v++] = c;
		}
		value[v] = 0;
		json_object_set_new(labels, name, json_string(value));
		p++;
		if (*p == ',')
			p++;
		else if (*p != '}')
			return expo_fail(x, "expected , or } after label %s", name);
	}
	*pp = p + 1;
	return 0;
}

/* The family a sample belongs to: its own name, or a histogram's _bucket/_sum/_count. */
static const char *expo_owner(expo *x, const char *name, const char **suffix)
{
	static const char *const suffixes[] = {"_bucket", "_sum", "_count"};
	*suffix = "";
	json_t *fam = json_object_get(x->families, name);
	if (fam && *json_string_value(json_object_get(fam, "type")))
		return name;
	for (size_t i = 0; i < 3; i++) {
		size_t n = strlen(name), k = strlen(suffixes[i]);
		if (n <= k || strcmp(name + n - k, suffixes[i]) != 0)
			continue;
		char stem[256];
		snprintf(stem, sizeof stem, "%.*s", (int)(n - k), name);
		const char *type =
		    json_string_value(json_object_get(json_object_get(x->families, stem), "type"));
		if (type &&
		    (strcmp(type, "histogram") == 0 || (strcmp(type, "summary") == 0 && i > 0))) {
			*suffix = suffixes[i];
			return json_object_iter_key(json_object_iter_at(x->families, stem));
		}
	}
	return NULL;
}

static int expo_sample(expo *x, const char *line)
{
	const char *p = line;
	size_t n = scan_name(p, true);
	if (n == 0)
		return expo_fail(x, "not a sample: \"%.80s\"", line);
	char name[256];
	snprintf(name, sizeof name, "%.*s", (int)n, p);
	p += n;
	json_t *labels = json_object();
	if (*p == '{' && expo_labels(x, &p, labels)) {
		json_decref(labels);
		return -1;
	}
	char value[64] = "", stamp[32] = "";
	int got = 0;
	if (*p == ' ') {
		size_t vn = strcspn(p + 1, " ");
		snprintf(value, sizeof value, "%.*s", (int)vn, p + 1);
		got = vn > 0 && vn < sizeof value;
		p += 1 + vn;
		if (*p == ' ') {
			snprintf(stamp, sizeof stamp, "%s", p + 1);
			got = got &&
			      (all_digits(stamp) || (stamp[0] == '-' && all_digits(stamp + 1)));
			p += strlen(p);
		}
	}
	if (!got || *p || !valid_float(value)) {
		json_decref(labels);
		return expo_fail(x, "bad value in \"%.120s\"", line);
	}
	const char *suffix, *owner = expo_owner(x, name, &suffix);
	if (!owner) {
		json_decref(labels);
		return expo_fail(x, "sample %s without a TYPE line before it", name);
	}
	json_t *fam = expo_family(x, owner);
	if (!fam) {
		json_decref(labels);
		return -1;
	}
	const char *type = json_string_value(json_object_get(fam, "type"));
	bool has_le = json_object_get(labels, "le") != NULL;
	int rc = 0;
	if (strcmp(type, "histogram") == 0 &&
	    (!*suffix || has_le != (strcmp(suffix, "_bucket") == 0)))
		rc = expo_fail(x, "histogram sample %s with%s le", name, has_le ? "" : "out");
	else if (has_le && !valid_float(json_string_value(json_object_get(labels, "le"))))
		rc = expo_fail(x, "le=\"%s\" is not a number",
			       json_string_value(json_object_get(labels, "le")));
	else if (strcmp(type, "counter") == 0 &&
		 (strlen(name) < 6 || strcmp(name + strlen(name) - 6, "_total") != 0))
		rc = expo_fail(x, "counter %s is not named *_total", name);
	else if (strcmp(type, "counter") == 0 && !(strtod(value, NULL) >= 0))
		rc = expo_fail(x, "counter %s is %s", name, value);
	char *key = json_dumps(labels, JSON_COMPACT | JSON_SORT_KEYS);
	char series[2048];
	snprintf(series, sizeof series, "%s%s", name, key ? key : "");
	free(key);
	if (!rc && json_object_get(x->series, series))
		rc = expo_fail(x, "series %s twice", series);
	if (rc) {
		json_decref(labels);
		return rc;
	}
	json_object_set_new(x->series, series, json_true());
	json_object_set_new(fam, "samples",
			    json_integer(json_integer_value(json_object_get(fam, "samples")) + 1));
	json_array_append_new(x->samples, json_pack("{s:s, s:s, s:o, s:s}", "name", name, "family",
						    owner, "labels", labels, "value", value));
	return 0;
}

/* Checks every histogram series: ascending le, cumulative counts, +Inf = _count, _sum. */
static int expo_histograms(expo *x)
{
	json_t *groups = json_object();
	size_t i;
	json_t *smp;
	json_array_foreach(x->samples, i, smp)
	{
		const char *fam = json_string_value(json_object_get(smp, "family"));
		const char *type =
		    json_string_value(json_object_get(json_object_get(x->families, fam), "type"));
		if (strcmp(type, "histogram") != 0)
			continue;
		json_t *labels = json_deep_copy(json_object_get(smp, "labels"));
		json_object_del(labels, "le");
		char *lk = json_dumps(labels, JSON_COMPACT | JSON_SORT_KEYS);
		json_decref(labels);
		char key[2048];
		snprintf(key, sizeof key, "%s%s", fam, lk ? lk : "");
		free(lk);
		json_t *g = json_object_get(groups, key);
		if (!g) {
			g = json_pack("{s:[]}", "buckets");
			json_object_set_new(groups, key, g);
		}
		const char *name = json_string_value(json_object_get(smp, "name"));
		const char *suffix = name + strlen(fam);
		if (strcmp(suffix, "_bucket") == 0)
			json_array_append(json_object_get(g, "buckets"), smp);
		else
			json_object_set(g, suffix, json_object_get(smp, "value"));
	}
	int rc = 0;
	const char *key;
	json_t *g;
	json_object_foreach(groups, key, g)
	{
		json_t *buckets = json_object_get(g, "buckets");
		const char *count = json_string_value(json_object_get(g, "_count"));
		size_t nb = json_array_size(buckets);
		if (nb == 0 || !count || !json_object_get(g, "_sum")) {
			rc = expo_fail(x, "histogram %s needs buckets, _sum and _count", key);
			break;
		}
		double prev_le = -INFINITY, prev_n = 0;
		json_t *b;
		json_array_foreach(buckets, i, b)
		{
			const char *le =
			    json_string_value(json_object_get(json_object_get(b, "labels"), "le"));
			const char *v = json_string_value(json_object_get(b, "value"));
			double lev = strtod(le, NULL), nv = strtod(v, NULL);
			if (!(lev > prev_le))
				rc = expo_fail(x, "histogram %s: le=\"%s\" after a bucket >= it",
					       key, le);
			else if (!all_digits(v) || nv < prev_n)
				rc = expo_fail(x, "histogram %s: bucket le=\"%s\" is %s after %g",
					       key, le, v, prev_n);
			if (rc)
				break;
			prev_le = lev;
			prev_n = nv;
		}
		if (rc)
			break;
		if (!isinf(prev_le)) {
			rc = expo_fail(x, "histogram %s has no le=\"+Inf\" bucket last", key);
			break;
		}
		if (!all_digits(count) || strtod(count, NULL) != prev_n) {
			rc = expo_fail(x, "histogram %s: _count %s but le=\"+Inf\" is %g", key,
				       count, prev_n);
			break;
		}
	}
	json_decref(groups);
	return rc;
}

int prom_parse(const char *text, json_t **out, char *err, size_t errlen)
{
	expo x = {json_object(), json_array(), json_object(), "", 0, err, errlen};
	int rc = 0;
	err[0] = 0;
	size_t len = strlen(text);
	if (len == 0 || text[len - 1] != '\n')
		rc = expo_fail(&x, "the exposition must end with a newline");
	for (const char *p = text; !rc && *p;) {
		const char *eol = strchr(p, '\n');
		size_t n = eol ? (size_t)(eol - p) : strlen(p);
		char *line = strndup(p, n);
		x.lineno++;
		if (n == 0)
			; /* blank lines are allowed */
		else if (line[0] == '#')
			rc = expo_comment(&x, line);
		else
			rc = expo_sample(&x, line);
		free(line);
		p += n + (eol ? 1 : 0);
	}
	x.lineno = 0;
	if (!rc)
		rc = expo_histograms(&x);
	json_decref(x.series);
	if (rc) {
		json_decref(x.families);
		json_decref(x.samples);
		return -1;
	}
	*out = json_pack("{s:o, s:o}", "families", x.families, "samples", x.samples);
	return 0;
}

/* The value of sample `name` with exactly the labels "k=v,k=v" ("" for none); NAN if absent. */
double prom_metric(const json_t *doc, const char *name, const char *labels)
{
	json_t *want = json_object();
	char buf[512];
	snprintf(buf, sizeof buf, "%s", labels);
	char *save = NULL;
	for (char *kv = strtok_r(buf, ",", &save); kv; kv = strtok_r(NULL, ",", &save)) {
		char *eq = strchr(kv, '=');
		assert_non_null(eq);
		*eq = 0;
		json_object_set_new(want, kv, json_string(eq + 1));
	}
	double v = NAN;
	size_t i;
	json_t *smp;
	json_array_foreach(json_object_get(doc, "samples"), i, smp)
	{
		if (strcmp(json_string_value(json_object_get(smp, "name")), name) == 0 &&
		    json_equal(json_object_get(smp, "labels"), want)) {
			v = strtod(json_string_value(json_object_get(smp, "value")), NULL);
			break;
		}
	}
	json_decref(want);
	return v;
}

/* The same, failing the test when the sample is absent. */
double prom_metric_of(const json_t *doc, const char *name, const char *labels)
{
	double v = prom_metric(doc, name, labels);
	if (isnan(v))
		fail_msg("/metrics has no sample %s{%s}", name, labels);
	return v;
}

void prom_assert_metric(const json_t *doc, const char *name, const char *labels, double want)
{
	double v = prom_metric_of(doc, name, labels);
	if (v != want)
		fail_msg("%s{%s} is %g, expected %g", name, labels, v, want);
}

/* GET /metrics: 200, text/plain; version=0.0.4, parsed strictly. New reference. */
json_t *prom_scrape(const hs_server *s)
{
	hs_response r;
	hs_get(s, "/metrics", &r);
	if (r.status != 200 || !r.body)
		fail_msg("GET /metrics: status %ld, body %.300s (%s)", r.status,
			 r.body ? r.body : "(none)", r.error);
	char ct[256];
	snprintf(ct, sizeof ct, "%s", r.content_type ? r.content_type : "");
	bool plain = strncasecmp(ct, "text/plain", 10) == 0 && (ct[10] == 0 || ct[10] == ';');
	bool version = false;
	char *save = NULL;
	for (char *param = strtok_r(ct, ";", &save); param; param = strtok_r(NULL, ";", &save)) {
		while (*param == ' ')
			param++;
		version |= strcmp(param, "version=0.0.4") == 0;
	}
	if (!plain || !version)
		fail_msg("GET /metrics: Content-Type %s, expected text/plain; version=0.0.4",
			 r.content_type ? r.content_type : "(none)");
	json_t *doc = NULL;
	char err[512];
	if (prom_parse(r.body, &doc, err, sizeof err) != 0)
		fail_msg("GET /metrics does not parse: %s\n%.3000s", err, r.body);
	hs_response_fini(&r);
	return doc;
}

typedef struct metric_wait {
	const hs_server *s;
	const char *name, *labels;
	double want;
} metric_wait;

static bool metric_is(void *arg)
{
	metric_wait *w = arg;
	json_t *doc = prom_scrape(w->s);
	bool ok = prom_metric(doc, w->name, w->labels) == w->want;
	json_decref(doc);
	return ok;
}

/* Polls /metrics until name{labels} == want; fails after `timeout_ms`. */
void prom_wait_metric(const hs_server *s, const char *name, const char *labels, double want,
		      int timeout_ms)
{
	metric_wait w = {s, name, labels, want};
	if (!hs_wait_until(metric_is, &w, timeout_ms)) {
		json_t *doc = prom_scrape(s);
		fail_msg("%s{%s} stayed %g, waited %d ms for %g", name, labels,
			 prom_metric(doc, name, labels), timeout_ms, want);
	}
}

void prom_assert_monotonic(const json_t *before, const json_t *after)
{
	size_t i;
	json_t *smp;
	json_array_foreach(json_object_get(before, "samples"), i, smp)
	{
		const char *fam = hs_str(smp, "family"), *name = hs_str(smp, "name");
		const char *type =
		    hs_str(json_object_get(json_object_get(before, "families"), fam), "type");
		size_t n = strlen(name);
		bool sum = n > 4 && strcmp(name + n - 4, "_sum") == 0;
		if (strcmp(type, "counter") != 0 && (strcmp(type, "histogram") != 0 || sum))
			continue;
		double was = strtod(hs_str(smp, "value"), NULL);
		size_t j;
		json_t *later;
		json_array_foreach(json_object_get(after, "samples"), j, later)
		{
			if (strcmp(hs_str(later, "name"), name) == 0 &&
			    json_equal(json_object_get(later, "labels"),
				       json_object_get(smp, "labels")) &&
			    strtod(hs_str(later, "value"), NULL) < was)
				fail_msg("%s went down from %g to %s", name, was,
					 hs_str(later, "value"));
		}
	}
}
