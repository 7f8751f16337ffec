/* SPDX-License-Identifier: MIT */
/* dsd.json into DsdConfig. One table (config_fields) gives every field's name, type, range
 * and default; the file parser, the command-line setter and config_init() all go through
 * it, so a default, a range or a message cannot differ between them. */
#include "config.h"

#include <assert.h>
#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <inttypes.h>
#include <math.h>
#include <pwd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "json_excerpt.h"

#include "log.h"

typedef enum FieldType {
        FT_MODEL,       /* an absolute path, or "" / null for none */
        FT_SOCKET_PATH, /* an absolute path that fits sun_path */
        FT_BACKEND,     /* "auto" | "cpu" | "cuda" */
        FT_BUS,         /* "system" | "session" | "none" */
        FT_LOG_LEVEL,   /* "error" | "warning" | "notice" | "info" | "debug" */
        FT_BOOL,
        FT_U32,      /* an integer in [lo, hi] */
        FT_U64,      /* same, stored as uint64_t (exact up to 2^53, far above hi) */
        FT_FRACTION, /* a number in (lo, hi] */
        FT_MODE,     /* an octal string "0660", at most 0777 */
        FT_UIDS,     /* an array of uids or user names */
        FT_GIDS,     /* an array of gids or group names */
} FieldType;

typedef struct ConfigField {
        const char *key; /* dotted: "limits.max_batch" is key max_batch of object limits */
        FieldType type;
        size_t offset;
        double lo, hi;
        const char *def; /* the default, as config_set() text */
} ConfigField;

#define F(key, type, member, lo, hi, def)                                                          \
        {                                                                                          \
                key, type, offsetof(DsdConfig, member), lo, hi, def                                \
        }

/* The defaults and ranges, in the order docs/operations.md and packaging/dsd.json list
 * them. Ranges are wide enough for any machine and small enough that products of them
 * (batch × context, clients × pending bytes) cannot overflow or exhaust memory. */
static const ConfigField config_fields[] = {
        /* key                              type            member lo        hi default */
        F("model", FT_MODEL, model, 0, 0, ""),
        F("backend", FT_BACKEND, backend, 0, 0, "auto"),
        F("device", FT_U32, device, 0, 255, "0"),
        F("quantize_at_load", FT_BOOL, quantize_at_load, 0, 0, "false"),
        F("lm_head_int8", FT_BOOL, lm_head_int8, 0, 0, "false"),
        F("lm_head_screen", FT_BOOL, lm_head_screen, 0, 0, "true"),
        F("limits.context_length", FT_U32, limits.context_length, 0, 1 << 24, "0"),
        F("limits.max_batch", FT_U32, limits.max_batch, 1, 1024, "16"),
        F("limits.queue_length", FT_U32, limits.queue_length, 0, 65536, "256"),
        F("limits.kv_memory_fraction", FT_FRACTION, limits.kv_memory_fraction, 0, 1, "0.9"),
        F("limits.client_max_requests", FT_U32, limits.client_max_requests, 1, 4096, "16"),
        F("limits.client_max_pending_events", FT_U32, limits.client_max_pending_events, 16, 1 << 20,
                "4096"),
        F("limits.client_max_pending_bytes", FT_U64, limits.client_max_pending_bytes, 4096,
                1ull << 32, "16777216"),
        F("socket.path", FT_SOCKET_PATH, socket_path, 0, 0, "/run/dsd/dsd.sock"),
        F("socket.mode", FT_MODE, socket_mode, 0, 0, "0660"),
        F("socket.allowed_uids", FT_UIDS, allowed_uids, 0, 0, ""),
        F("socket.allowed_gids", FT_GIDS, allowed_gids, 0, 0, ""),
        F("log_level", FT_LOG_LEVEL, log_level, 0, 0, "info"),
        F("bus", FT_BUS, bus, 0, 0, "system"),
        F("stop_timeout_sec", FT_U32, stop_timeout_sec, 1, 3600, "60"),
};

#undef F

static const char *const backend_names[_CONFIG_BACKEND_MAX] = {
        [CONFIG_BACKEND_AUTO] = "auto",
        [CONFIG_BACKEND_CPU] = "cpu",
        [CONFIG_BACKEND_CUDA] = "cuda",
};

static const char *const bus_names[_CONFIG_BUS_MAX] = {
        [CONFIG_BUS_SYSTEM] = "system",
        [CONFIG_BUS_SESSION] = "session",
        [CONFIG_BUS_NONE] = "none",
};

static const struct {
        const char *name;
        int level;
} log_levels[] = {
        {"error", LOG_LVL_ERR},
        {"warning", LOG_LVL_WARNING},
        {"notice", LOG_LVL_NOTICE},
        {"info", LOG_LVL_INFO},
        {"debug", LOG_LVL_DEBUG},
};

const char *config_backend_to_string(ConfigBackend b)
{
        return b >= 0 && b < _CONFIG_BACKEND_MAX ? backend_names[b] : NULL;
}

const char *config_bus_to_string(ConfigBus b)
{
        return b >= 0 && b < _CONFIG_BUS_MAX ? bus_names[b] : NULL;
}

void config_device(const DsdConfig *c, char *buf, size_t size)
{
        snprintf(buf, size, "%" PRIu32 "%s", c->device, c->lm_head_screen ? "" : " no-screen");
}

static void cjson_deletep(cJSON **j)
{
        cJSON_Delete(*j);
}

// --- Positions -------------------------------------------------------------------------------

/* Where a message points: a file (text to search for the key) or a command-line flag. */
typedef struct Origin {
        const char *name;
        const char *text; /* NULL for config_set() */
        size_t len;
} Origin;

static void offset_to_line_col(const char *text, size_t off, unsigned *ret_line, unsigned *ret_col)
{
        unsigned line = 1, col = 1;

        for (size_t i = 0; i < off; i++) {
                if (text[i] == '\n') {
                        line++;
                        col = 1;
                } else
                        col++;
        }
        *ret_line = line;
        *ret_col = col;
}

/* The end of the string literal starting at text[i] == '"', or len if unterminated. */
static size_t skip_string(const char *text, size_t len, size_t i)
{
        for (i++; i < len; i++) {
                if (text[i] == '\\')
                        i++;
                else if (text[i] == '"')
                        return i + 1;
        }
        return len;
}

/* The offset of the key of the dotted field path in the text, matching keys by nesting
 * depth, or SIZE_MAX. Keys are compared as written, so one spelled with \u escapes is not
 * found; the caller then prints no position. An empty path finds the first token. */
static size_t locate_key(const char *text, size_t len, const char *path)
{
        char parts[4][64];
        size_t n_parts = 0, matched = 0, depth = 0;

        for (const char *p = path; *p && n_parts < ELEMENTSOF(parts);) {
                size_t n = strcspn(p, ".");
                if (n >= sizeof(parts[0]))
                        return SIZE_MAX;
                memcpy(parts[n_parts], p, n);
                parts[n_parts++][n] = 0;
                p += n + (p[n] == '.');
        }

        for (size_t i = 0; i < len; i++) {
                char ch = text[i];

                if (n_parts == 0 && !strchr(" \t\r\n", ch))
                        return i;
                if (ch == '{' || ch == '[')
                        depth++;
                else if (ch == '}' || ch == ']') {
                        if (depth > 0)
                                depth--;
                        matched = MIN(matched, depth);
                } else if (ch == '"') {
                        size_t end = skip_string(text, len, i), j = end;

                        while (j < len && strchr(" \t\r\n", text[j]))
                                j++;
                        if (j < len && text[j] == ':' && depth > 0) {
                                /* A key at or above the matched level starts a sibling. */
                                if (depth <= matched)
                                        matched = depth - 1;
                                if (depth == matched + 1 && matched < n_parts &&
                                        end - i - 2 == strlen(parts[matched]) &&
                                        memcmp(text + i + 1, parts[matched], end - i - 2) == 0 &&
                                        ++matched == n_parts)
                                        return i;
                        }
                        i = end - 1;
                }
        }
        return SIZE_MAX;
}

/* Formats "NAME:LINE:COLUMN: " (or "NAME: " without a position) into buf. */
static const char *origin_prefix(const Origin *o, const char *key, char *buf, size_t size)
{
        size_t off = o->text ? locate_key(o->text, o->len, key) : SIZE_MAX;
        unsigned line, col;

        if (off == SIZE_MAX) {
                snprintf(buf, size, "%s", o->name);
                return buf;
        }
        offset_to_line_col(o->text, off, &line, &col);
        snprintf(buf, size, "%s:%u:%u", o->name, line, col);
        return buf;
}

static int field_fail(
        const Origin *o, DsError *err, const char *key, const cJSON *v, const char *want)
{
        char where[512], got[64];

        return ds_error(err, -DS_ERR_FORMAT, "%s: field '%s' must be %s, got %s",
                origin_prefix(o, key, where, sizeof(where)), key, want,
                json_excerpt(v, got, sizeof(got)));
}

static int field_fail_msg(const Origin *o, DsError *err, const char *key, const char *msg)
{
        char where[512];

        return ds_error(err, -DS_ERR_FORMAT, "%s: field '%s' %s",
                origin_prefix(o, key, where, sizeof(where)), key, msg);
}

// --- Field values ----------------------------------------------------------------------------

static int parse_name_enum(const char *s, const char *const *names, size_t n)
{
        for (size_t i = 0; i < n; i++)
                if (names[i] && strcmp(s, names[i]) == 0)
                        return (int) i;
        return -EINVAL;
}

static int parse_log_level(const char *s)
{
        for (size_t i = 0; i < ELEMENTSOF(log_levels); i++)
                if (strcmp(s, log_levels[i].name) == 0)
                        return log_levels[i].level;
        return -EINVAL;
}

static const char *log_level_to_string(int level)
{
        for (size_t i = 0; i < ELEMENTSOF(log_levels); i++)
                if (log_levels[i].level == level)
                        return log_levels[i].name;
        return NULL;
}

/* User and group names as useradd accepts them; anything else is refused before NSS sees
 * it, so that a typo gets a clear message rather than a slow lookup. */
static bool valid_user_name(const char *s)
{
        size_t n = strlen(s);

        if (n == 0 || n > 32 || !(s[0] == '_' || (s[0] >= 'a' && s[0] <= 'z')))
                return false;
        for (size_t i = 1; i < n; i++)
                if (!(s[i] == '_' || s[i] == '-' || (s[i] >= 'a' && s[i] <= 'z') ||
                            (s[i] >= '0' && s[i] <= '9')))
                        return false;
        return true;
}

/* Resolves one allowed_uids/allowed_gids entry: a number below 2^32-1 or a name. */
static int parse_id(
        const Origin *o, DsError *err, const char *key, const cJSON *v, bool group, uint32_t *ret)
{
        const char *want =
                group ? "an array of gids or group names" : "an array of uids or user names";
        char msg[128];

        if (cJSON_IsNumber(v)) {
                double d = v->valuedouble;
                /* (uid_t) -1 means "unchanged" to chown() and cannot name anyone. */
                if (!isfinite(d) || d != floor(d) || d < 0 || d >= 4294967295.0)
                        return field_fail(o, err, key, v, want);
                *ret = (uint32_t) d;
                return 0;
        }
        if (!cJSON_IsString(v) || !valid_user_name(v->valuestring))
                return field_fail(o, err, key, v, want);
        if (group) {
                struct group *g = getgrnam(v->valuestring);
                if (!g) {
                        snprintf(msg, sizeof(msg), "names group '%s', which does not exist",
                                v->valuestring);
                        return field_fail_msg(o, err, key, msg);
                }
                *ret = g->gr_gid;
        } else {
                struct passwd *p = getpwnam(v->valuestring);
                if (!p) {
                        snprintf(msg, sizeof(msg), "names user '%s', which does not exist",
                                v->valuestring);
                        return field_fail_msg(o, err, key, msg);
                }
                *ret = p->pw_uid;
        }
        return 0;
}

static int parse_ids(
        const Origin *o, DsError *err, const ConfigField *f, const cJSON *v, DsdConfig *c)
{
        bool group = f->type == FT_GIDS;
        uint32_t ids[CONFIG_IDS_MAX];
        size_t n = 0;
        const cJSON *item;
        char msg[64];
        int r;

        if (!cJSON_IsArray(v))
                return field_fail(o, err, f->key, v,
                        group ? "an array of gids or group names"
                              : "an array of uids or user names");
        cJSON_ArrayForEach(item, v)
        {
                if (n == CONFIG_IDS_MAX) {
                        snprintf(msg, sizeof(msg), "has more than %u entries", CONFIG_IDS_MAX);
                        return field_fail_msg(o, err, f->key, msg);
                }
                r = parse_id(o, err, f->key, item, group, &ids[n]);
                if (r < 0)
                        return r;
                n++;
        }
        for (size_t i = 0; i < n; i++) {
                if (group)
                        c->allowed_gids[i] = (gid_t) ids[i];
                else
                        c->allowed_uids[i] = (uid_t) ids[i];
        }
        if (group)
                c->n_allowed_gids = n;
        else
                c->n_allowed_uids = n;
        return 0;
}

static int parse_path(const Origin *o, DsError *err, const ConfigField *f, const cJSON *v,
        size_t size, bool empty_ok, char *ret)
{
        char want[80];

        snprintf(want, sizeof(want), "%san absolute path shorter than %zu bytes",
                empty_ok ? "null, \"\" or " : "", size);
        if (!cJSON_IsString(v))
                return field_fail(o, err, f->key, v, want);
        if (v->valuestring[0] == 0 && empty_ok) {
                ret[0] = 0;
                return 0;
        }
        if (v->valuestring[0] != '/' || strlen(v->valuestring) >= size)
                return field_fail(o, err, f->key, v, want);
        strcpy(ret, v->valuestring);
        return 0;
}

/* Validates v (never NULL: absent and null values do not get here, except a null model)
 * and stores it into c. c is written only when the value is valid. */
static int field_apply(
        const Origin *o, DsError *err, const ConfigField *f, const cJSON *v, DsdConfig *c)
{
        void *dst = (char *) c + f->offset;
        char want[96];
        int x;

        switch (f->type) {
        case FT_MODEL:
                if (cJSON_IsNull(v)) {
                        c->model[0] = 0;
                        return 0;
                }
                return parse_path(o, err, f, v, sizeof(c->model), true, c->model);
        case FT_SOCKET_PATH:
                return parse_path(o, err, f, v, sizeof(c->socket_path), false, c->socket_path);
        case FT_BACKEND:
                x = cJSON_IsString(v)
                            ? parse_name_enum(v->valuestring, backend_names, _CONFIG_BACKEND_MAX)
                            : -EINVAL;
                if (x < 0)
                        return field_fail(o, err, f->key, v, "\"auto\", \"cpu\" or \"cuda\"");
                *(ConfigBackend *) dst = (ConfigBackend) x;
                return 0;
        case FT_BUS:
                x = cJSON_IsString(v) ? parse_name_enum(v->valuestring, bus_names, _CONFIG_BUS_MAX)
                                      : -EINVAL;
                if (x < 0)
                        return field_fail(o, err, f->key, v, "\"system\", \"session\" or \"none\"");
                *(ConfigBus *) dst = (ConfigBus) x;
                return 0;
        case FT_LOG_LEVEL:
                x = cJSON_IsString(v) ? parse_log_level(v->valuestring) : -EINVAL;
                if (x < 0)
                        return field_fail(o, err, f->key, v,
                                "\"error\", \"warning\", \"notice\", \"info\" or \"debug\"");
                *(int *) dst = x;
                return 0;
        case FT_BOOL:
                if (!cJSON_IsBool(v))
                        return field_fail(o, err, f->key, v, "true or false");
                *(bool *) dst = cJSON_IsTrue(v);
                return 0;
        case FT_U32:
        case FT_U64: {
                snprintf(want, sizeof(want), "an integer in [%.0f, %.0f]", f->lo, f->hi);
                if (!cJSON_IsNumber(v))
                        return field_fail(o, err, f->key, v, want);
                double d = v->valuedouble;
                if (!isfinite(d) || d != floor(d) || d < f->lo || d > f->hi)
                        return field_fail(o, err, f->key, v, want);
                if (f->type == FT_U32)
                        *(uint32_t *) dst = (uint32_t) d;
                else
                        *(uint64_t *) dst = (uint64_t) d;
                return 0;
        }
        case FT_FRACTION: {
                snprintf(want, sizeof(want), "a number in (%g, %g]", f->lo, f->hi);
                if (!cJSON_IsNumber(v))
                        return field_fail(o, err, f->key, v, want);
                double d = v->valuedouble;
                if (!isfinite(d) || d <= f->lo || d > f->hi)
                        return field_fail(o, err, f->key, v, want);
                *(double *) dst = d;
                return 0;
        }
        case FT_MODE: {
                /* A string, because a JSON number 0660 is not valid and 660 would be
                 * decimal. */
                const char *s = cJSON_IsString(v) ? v->valuestring : "";
                size_t n = strspn(s, "01234567");
                unsigned long m = n ? strtoul(s, NULL, 8) : 0;
                if (n < 3 || n > 4 || s[n] || m > 0777)
                        return field_fail(
                                o, err, f->key, v, "an octal mode string from \"000\" to \"0777\"");
                *(mode_t *) dst = (mode_t) m;
                return 0;
        }
        case FT_UIDS:
        case FT_GIDS:
                return parse_ids(o, err, f, v, c);
        }
        return -EINVAL;
}

static const ConfigField *field_find(const char *key)
{
        for (size_t i = 0; i < ELEMENTSOF(config_fields); i++)
                if (strcmp(config_fields[i].key, key) == 0)
                        return &config_fields[i];
        return NULL;
}

/* Whether some field's key starts with "name.": then name is an object of fields. */
static bool is_group(const char *name)
{
        size_t n = strlen(name);

        for (size_t i = 0; i < ELEMENTSOF(config_fields); i++)
                if (strncmp(config_fields[i].key, name, n) == 0 && config_fields[i].key[n] == '.')
                        return true;
        return false;
}

// --- Text values (command line and defaults) -------------------------------------------------

/* The JSON value a command-line text stands for under the field's type; a text that is
 * not of the type becomes a string, so that field_apply() words the refusal. */
static cJSON *text_to_json(const ConfigField *f, const char *s)
{
        char *end;

        switch (f->type) {
        case FT_BOOL:
                if (strcmp(s, "true") == 0 || strcmp(s, "yes") == 0 || strcmp(s, "1") == 0)
                        return cJSON_CreateTrue();
                if (strcmp(s, "false") == 0 || strcmp(s, "no") == 0 || strcmp(s, "0") == 0)
                        return cJSON_CreateFalse();
                return cJSON_CreateString(s);
        case FT_U32:
        case FT_U64:
        case FT_FRACTION: {
                errno = 0;
                double d = strtod(s, &end);
                if (errno || end == s || *end || strchr(" \t\n", s[0]))
                        return cJSON_CreateString(s);
                return cJSON_CreateNumber(d);
        }
        case FT_UIDS:
        case FT_GIDS: {
                cJSON *a = cJSON_CreateArray();
                for (const char *p = s; a && *p;) {
                        char item[64];
                        size_t n = strcspn(p, ",");
                        snprintf(item, sizeof(item), "%.*s", (int) MIN(n, sizeof(item) - 1), p);
                        bool digits = n > 0 && strspn(item, "0123456789") == strlen(item);
                        cJSON *j = digits ? cJSON_CreateNumber(strtod(item, NULL))
                                          : cJSON_CreateString(item);
                        if (!j || !cJSON_AddItemToArray(a, j)) {
                                cJSON_Delete(j);
                                cJSON_Delete(a);
                                return NULL;
                        }
                        p += n + (p[n] == ',');
                }
                return a;
        }
        default:
                return cJSON_CreateString(s);
        }
}

/* "http" replaces the object with JSON text; "http.listen" sets one member of it. Its
 * other members are daemon/http's to check. */
static int http_set(
        DsdConfig *c, const char *source, const char *key, const char *value, DsError *err)
{
        _cleanup_(cjson_deletep) cJSON *obj = NULL;
        _cleanup_free_ char *text = NULL;

        if (!strcmp(key, "http")) {
                obj = cJSON_Parse(value);
                if (!cJSON_IsObject(obj))
                        return ds_error(
                                err, -EINVAL, "%s: field 'http': not a JSON object", source);
        } else {
                obj = c->http[0] ? cJSON_Parse(c->http) : cJSON_CreateObject();
                if (!obj)
                        return ds_error(err, -ENOMEM, "%s: out of memory", source);
                cJSON_DeleteItemFromObjectCaseSensitive(obj, "listen");
                if (!cJSON_AddStringToObject(obj, "listen", value))
                        return ds_error(err, -ENOMEM, "%s: out of memory", source);
        }
        text = cJSON_PrintUnformatted(obj);
        if (!text)
                return ds_error(err, -ENOMEM, "%s: out of memory", source);
        if (strlen(text) >= sizeof(c->http))
                return ds_error(err, -E2BIG, "%s: field 'http': too large", source);
        strcpy(c->http, text);
        return 0;
}

int config_set(DsdConfig *c, const char *source, const char *key, const char *value, DsError *err)
{
        _cleanup_(cjson_deletep) cJSON *v = NULL;
        _cleanup_free_ char *abs = NULL;
        const ConfigField *f;
        Origin o = {.name = source};
        DsdConfig n;
        int r;

        if (!c || !source || !key || !value)
                return -EINVAL;
        if (!strcmp(key, "http") || !strcmp(key, "http.listen"))
                return http_set(c, source, key, value, err);
        f = field_find(key);
        if (!f)
                return ds_error(err, -EINVAL, "%s: unknown field '%s'", source, key);

        /* A relative model path on the command line means the working directory's. */
        if (f->type == FT_MODEL && value[0] && value[0] != '/') {
                char cwd[PATH_MAX];
                if (!getcwd(cwd, sizeof(cwd)) || asprintf(&abs, "%s/%s", cwd, value) < 0)
                        return ds_error(err, -errno, "%s: cannot make '%s' absolute: %s", source,
                                value, strerror(errno));
                value = abs;
        }
        v = text_to_json(f, value);
        if (!v)
                return ds_error(err, -ENOMEM, "%s: out of memory", source);
        n = *c;
        r = field_apply(&o, err, f, v, &n);
        if (r < 0)
                return r;
        *c = n;
        return 0;
}

void config_init(DsdConfig *c)
{
        memset(c, 0, sizeof(*c));
        for (size_t i = 0; i < ELEMENTSOF(config_fields); i++) {
                /* The defaults are constants; test-config checks that each one is valid. */
                _unused_ int r =
                        config_set(c, "default", config_fields[i].key, config_fields[i].def, NULL);
                assert(r == 0);
        }
}

// --- The file --------------------------------------------------------------------------------

/* Applies the members of one JSON object; prefix is "" or "limits." etc. */
static int apply_object(
        const Origin *o, DsError *err, const cJSON *obj, const char *prefix, DsdConfig *c)
{
        const cJSON *v;
        int r;

        cJSON_ArrayForEach(v, obj)
        {
                char key[128];

                snprintf(key, sizeof(key), "%s%s", prefix, v->string);
                /* cJSON keeps duplicates and lookups see the first: refuse, so that what
                 * the daemon uses is never ambiguous. */
                for (const cJSON *p = obj->child; p != v; p = p->next)
                        if (strcmp(p->string, v->string) == 0)
                                return field_fail_msg(o, err, key, "appears more than once");

                /* The HTTP listener's object: daemon/http parses and checks it. */
                if (!prefix[0] && strcmp(v->string, "http") == 0) {
                        _cleanup_free_ char *text = NULL;
                        if (cJSON_IsNull(v))
                                continue;
                        if (!cJSON_IsObject(v))
                                return field_fail(o, err, key, v, "an object");
                        text = cJSON_PrintUnformatted(v);
                        if (!text || strlen(text) >= sizeof(c->http))
                                return field_fail_msg(o, err, key, "is too large");
                        strcpy(c->http, text);
                        continue;
                }
                if (!prefix[0] && is_group(v->string)) {
                        char sub[80];
                        if (cJSON_IsNull(v))
                                continue;
                        if (!cJSON_IsObject(v))
                                return field_fail(o, err, key, v, "an object");
                        snprintf(sub, sizeof(sub), "%s.", v->string);
                        r = apply_object(o, err, v, sub, c);
                        if (r < 0)
                                return r;
                        continue;
                }

                const ConfigField *f = field_find(key);
                if (!f || strchr(v->string, '.'))
                        return field_fail_msg(o, err, key, "is not a known field");
                if (cJSON_IsNull(v) && f->type != FT_MODEL)
                        continue;
                r = field_apply(o, err, f, v, c);
                if (r < 0)
                        return r;
        }
        return 0;
}

int config_parse(const char *name, const char *json, size_t len, DsdConfig *ret, DsError *err)
{
        _cleanup_(cjson_deletep) cJSON *root = NULL;
        Origin o = {.name = name, .text = json, .len = len};
        const char *end = NULL;
        unsigned line, col;
        DsdConfig c;
        int r;

        if (!name || (!json && len) || !ret)
                return -EINVAL;
        if (!json)
                json = "";
        if (len > CONFIG_FILE_MAX)
                return ds_error(err, -EFBIG, "%s: larger than %u bytes", name, CONFIG_FILE_MAX);
        /* cJSON stops at a NUL byte; one inside the text would hide what follows it. */
        if (memchr(json, 0, len))
                return ds_error(err, -DS_ERR_FORMAT, "%s: contains a NUL byte", name);

        root = cJSON_ParseWithLengthOpts(json, len, &end, false);
        if (!root) {
                size_t off = end && end >= json && end <= json + len ? (size_t) (end - json) : 0;
                offset_to_line_col(json, off, &line, &col);
                return ds_error(err, -DS_ERR_FORMAT, "%s:%u:%u: not valid JSON", name, line, col);
        }
        for (size_t off = (size_t) (end - json); off < len; off++)
                if (!strchr(" \t\r\n", json[off])) {
                        offset_to_line_col(json, off, &line, &col);
                        return ds_error(err, -DS_ERR_FORMAT,
                                "%s:%u:%u: unexpected text after the JSON object", name, line, col);
                }
        if (!cJSON_IsObject(root)) {
                char where[512];
                return ds_error(err, -DS_ERR_FORMAT, "%s: the top level must be an object",
                        origin_prefix(&o, "", where, sizeof(where)));
        }

        config_init(&c);
        r = apply_object(&o, err, root, "", &c);
        if (r < 0)
                return r;
        *ret = c;
        return 0;
}

int config_load(const char *path, bool missing_ok, DsdConfig *ret, DsError *err)
{
        _cleanup_close_ int fd = -EBADF;
        _cleanup_free_ char *buf = NULL;
        struct stat st;
        size_t n = 0;
        int r;

        if (!path || !ret)
                return -EINVAL;
        fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY);
        if (fd < 0) {
                if (errno == ENOENT && missing_ok) {
                        config_init(ret);
                        return 0;
                }
                return ds_error(err, -errno, "%s: cannot open: %s", path, strerror(errno));
        }
        if (fstat(fd, &st) < 0)
                return ds_error(err, -errno, "%s: cannot stat: %s", path, strerror(errno));
        if (!S_ISREG(st.st_mode))
                return ds_error(err, -EINVAL, "%s: not a regular file", path);
        if ((uint64_t) st.st_size > CONFIG_FILE_MAX)
                return ds_error(err, -EFBIG, "%s: larger than %u bytes", path, CONFIG_FILE_MAX);

        /* Read to EOF rather than trusting st_size, which a concurrent writer can change. */
        buf = malloc(CONFIG_FILE_MAX + 1);
        if (!buf)
                return ds_error(err, -ENOMEM, "%s: out of memory", path);
        for (;;) {
                ssize_t k = read(fd, buf + n, CONFIG_FILE_MAX + 1 - n);
                if (k < 0) {
                        if (errno == EINTR)
                                continue;
                        return ds_error(err, -errno, "%s: cannot read: %s", path, strerror(errno));
                }
                if (k == 0)
                        break;
                n += (size_t) k;
                if (n > CONFIG_FILE_MAX)
                        return ds_error(
                                err, -EFBIG, "%s: larger than %u bytes", path, CONFIG_FILE_MAX);
        }
        r = config_parse(path, buf, n, ret, err);
        if (r < 0)
                return r;
        return 1;
}

// --- Output ----------------------------------------------------------------------------------

static cJSON *field_to_json(const ConfigField *f, const DsdConfig *c)
{
        const void *src = (const char *) c + f->offset;
        char mode[8];

        switch (f->type) {
        case FT_MODEL:
                return c->model[0] ? cJSON_CreateString(c->model) : cJSON_CreateNull();
        case FT_SOCKET_PATH:
                return cJSON_CreateString(c->socket_path);
        case FT_BACKEND:
                return cJSON_CreateString(config_backend_to_string(c->backend));
        case FT_BUS:
                return cJSON_CreateString(config_bus_to_string(c->bus));
        case FT_LOG_LEVEL:
                return cJSON_CreateString(log_level_to_string(c->log_level));
        case FT_BOOL:
                return cJSON_CreateBool(*(const bool *) src);
        case FT_U32:
                return cJSON_CreateNumber(*(const uint32_t *) src);
        case FT_U64:
                return cJSON_CreateNumber((double) *(const uint64_t *) src);
        case FT_FRACTION:
                return cJSON_CreateNumber(*(const double *) src);
        case FT_MODE:
                snprintf(mode, sizeof(mode), "%04o", (unsigned) c->socket_mode);
                return cJSON_CreateString(mode);
        case FT_UIDS:
        case FT_GIDS: {
                bool group = f->type == FT_GIDS;
                size_t n = group ? c->n_allowed_gids : c->n_allowed_uids;
                cJSON *a = cJSON_CreateArray();
                for (size_t i = 0; a && i < n; i++) {
                        cJSON *j = cJSON_CreateNumber(
                                group ? (double) c->allowed_gids[i] : (double) c->allowed_uids[i]);
                        if (!j || !cJSON_AddItemToArray(a, j)) {
                                cJSON_Delete(j);
                                cJSON_Delete(a);
                                return NULL;
                        }
                }
                return a;
        }
        }
        return NULL;
}

int config_to_json(const DsdConfig *c, char **ret)
{
        _cleanup_(cjson_deletep) cJSON *root = cJSON_CreateObject();
        char *s;

        if (!c || !ret)
                return -EINVAL;
        if (!root)
                return -ENOMEM;
        for (size_t i = 0; i < ELEMENTSOF(config_fields); i++) {
                const ConfigField *f = &config_fields[i];
                const char *dot = strchr(f->key, '.');
                cJSON *parent = root, *v;

                if (dot) {
                        char group[64];
                        snprintf(group, sizeof(group), "%.*s", (int) (dot - f->key), f->key);
                        parent = cJSON_GetObjectItemCaseSensitive(root, group);
                        if (!parent)
                                parent = cJSON_AddObjectToObject(root, group);
                        if (!parent)
                                return -ENOMEM;
                }
                v = field_to_json(f, c);
                if (!v || !cJSON_AddItemToObject(parent, dot ? dot + 1 : f->key, v)) {
                        cJSON_Delete(v);
                        return -ENOMEM;
                }
        }
        s = cJSON_Print(root);
        if (!s)
                return -ENOMEM;
        *ret = s;
        return 0;
}
