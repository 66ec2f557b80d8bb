/*
 * tokenizer_unicode — Unicode properties in regexes as tokenizers' newer
 * tables class them, as far as utf8proc knows (tokenizer_internal.h).
 *
 * PCRE2 10.42 (Debian 12) has Unicode 14's tables: every code point assigned
 * in Unicode 15 (Kawi, Nag Mundari, Cyrillic Extended-D, Kaktovik numerals,
 * CJK Extension H, the moose and the shaking face ...) is unassigned (Cn) to
 * it. tokenizers 0.23 runs its patterns with Oniguruma and its fixed
 * pre-tokenizers with Rust's char and regex crate, all of Unicode 16, so
 * \p{L}, \p{N}, \p{So}, \w, \d put those code points elsewhere than PCRE2.
 * utf8proc 2.8 (Unicode 15.0) knows the general category of Unicode 15's;
 * unicode_newer.h (tools/gen_unicode_newer.py, from the Unicode Character
 * Database as unicodedata2 16.0.0 ships it) those of Unicode 15.1 and 16.0
 * (Cyrillic Extended-C, Arabic Extended-B, Garay, the new emoji ...). Once per
 * process, the code points that either assigns and PCRE2 matches with \p{Cn}
 * are collected (10,301 with these libraries, 126 runs of one category); a
 * property escape whose set takes any of them is spelled for PCRE2 as its own
 * class plus those ranges, so PCRE2's fast property lookup still does the
 * rest. The ranges come from asking the libraries and the table; a newer
 * PCRE2 or utf8proc changes them by itself.
 *
 * What this reaches: the general categories (\p{L}, \p{Lu}, \p{N}, \p{So},
 * \p{C}, \p{Cn}, their long names, negated or not, inside and outside a
 * class) and Alphabetic (in \w: its letters and letter numbers; the marks
 * that are Other_Alphabetic are in \w through \p{M}, but a bare
 * \p{Alphabetic} misses the new ones: neither utf8proc nor the table has
 * Other_Alphabetic). Scripts (\p{Cyrillic}), Emoji and the other binary
 * properties keep PCRE2's Unicode 14.
 *
 * Under (?i), PCRE2 does not fold the new code points' case pairs (Unicode 16's
 * U+1C89/U+1C8A, Cyrillic TJE): a pattern that needs them to fold is rare.
 */
#include "tokenizer_internal.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "core/util.h"
#include "unicode_newer.h"

#define CAT(c) (1u << UTF8PROC_CATEGORY_##c)
#define CATS_L (CAT(LU) | CAT(LL) | CAT(LT) | CAT(LM) | CAT(LO))
#define CATS_M (CAT(MN) | CAT(MC) | CAT(ME))
#define CATS_N (CAT(ND) | CAT(NL) | CAT(NO))
#define CATS_P (CAT(PC) | CAT(PD) | CAT(PS) | CAT(PE) | CAT(PI) | CAT(PF) | CAT(PO))
#define CATS_S (CAT(SM) | CAT(SC) | CAT(SK) | CAT(SO))
#define CATS_Z (CAT(ZS) | CAT(ZL) | CAT(ZP))
#define CATS_C (CAT(CC) | CAT(CF) | CAT(CS) | CAT(CO) | CAT(CN))
#define CATS_ALL (CATS_L | CATS_M | CATS_N | CATS_P | CATS_S | CATS_Z | CATS_C)

/* PCRE2's short name of each category, in utf8proc_category_t's order. */
static const char *const category_names[] = {"Cn", "Lu", "Ll", "Lt", "Lm", "Lo", "Mn", "Mc", "Me", "Nd",
                                              "Nl", "No", "Pc", "Pd", "Ps", "Pe", "Pi", "Pf", "Po", "Sm",
                                              "Sc", "Sk", "So", "Zs", "Zl", "Zp", "Cc", "Cf", "Cs", "Co"};

/* The properties this widens, by the names Oniguruma takes (compared in
 * lower case without spaces, '_' and '-', as both engines compare them;
 * '|' separates synonyms): the categories that make the set, and the name
 * PCRE2 10.42 takes (it refuses the long ones, so \p{Letter} is spelled
 * \p{L}). Alphabetic is not a union of categories: its new members are
 * taken as its letters and letter numbers (see the top). Names such as
 * Digit, Punct and Alnum are Oniguruma's POSIX brackets, not categories,
 * and are not here. */
static const struct property {
    const char *names;
    const char *pcre2;
    uint32_t cats;
    bool category;
} properties[] = {
    {"l|letter", "L", CATS_L, true},
    {"lc|casedletter", "LC", CAT(LU) | CAT(LL) | CAT(LT), true},
    {"lu|uppercaseletter", "Lu", CAT(LU), true},
    {"ll|lowercaseletter", "Ll", CAT(LL), true},
    {"lt|titlecaseletter", "Lt", CAT(LT), true},
    {"lm|modifierletter", "Lm", CAT(LM), true},
    {"lo|otherletter", "Lo", CAT(LO), true},
    {"m|mark|combiningmark", "M", CATS_M, true},
    {"mn|nonspacingmark", "Mn", CAT(MN), true},
    {"mc|spacingmark", "Mc", CAT(MC), true},
    {"me|enclosingmark", "Me", CAT(ME), true},
    {"n|number", "N", CATS_N, true},
    {"nd|decimalnumber", "Nd", CAT(ND), true},
    {"nl|letternumber", "Nl", CAT(NL), true},
    {"no|othernumber", "No", CAT(NO), true},
    {"p|punctuation", "P", CATS_P, true},
    {"pc|connectorpunctuation", "Pc", CAT(PC), true},
    {"pd|dashpunctuation", "Pd", CAT(PD), true},
    {"ps|openpunctuation", "Ps", CAT(PS), true},
    {"pe|closepunctuation", "Pe", CAT(PE), true},
    {"pi|initialpunctuation", "Pi", CAT(PI), true},
    {"pf|finalpunctuation", "Pf", CAT(PF), true},
    {"po|otherpunctuation", "Po", CAT(PO), true},
    {"s|symbol", "S", CATS_S, true},
    {"sm|mathsymbol", "Sm", CAT(SM), true},
    {"sc|currencysymbol", "Sc", CAT(SC), true},
    {"sk|modifiersymbol", "Sk", CAT(SK), true},
    {"so|othersymbol", "So", CAT(SO), true},
    {"z|separator", "Z", CATS_Z, true},
    {"zs|spaceseparator", "Zs", CAT(ZS), true},
    {"zl|lineseparator", "Zl", CAT(ZL), true},
    {"zp|paragraphseparator", "Zp", CAT(ZP), true},
    {"c|other", "C", CATS_C, true},
    {"cc|control", "Cc", CAT(CC), true},
    {"cf|format", "Cf", CAT(CF), true},
    {"cn|unassigned", "Cn", CAT(CN), true},
    {"co|privateuse", "Co", CAT(CO), true},
    {"cs|surrogate", "Cs", CAT(CS), true},
    {"alphabetic|alpha", "Alphabetic", CATS_L | CAT(NL), false},
};

/* The groups spelled by one name when a set holds all of them (C without Cn:
 * PCRE2's \p{C} holds the new code points). */
static const struct {
    const char *pcre2;
    uint32_t cats;
} groups[] = {{"L", CATS_L}, {"M", CATS_M}, {"N", CATS_N}, {"P", CATS_P}, {"S", CATS_S}, {"Z", CATS_Z}};

struct cp_range {
    uint32_t first, last;
    int category; /* utf8proc_category_t */
};

/* Computed once per process (pthread_once), read-only after. */
static struct {
    struct cp_range *newer;   /* assigned by utf8proc, Cn to PCRE2 */
    size_t n_newer;
    struct cp_range *unassigned; /* Cn to utf8proc (surrogates aside: Cs) */
    size_t n_unassigned;
} tables;
static pthread_once_t tables_once = PTHREAD_ONCE_INIT;

static void push_range(struct cp_range **v, size_t *n, size_t *cap, uint32_t cp, int category)
{
    if (*n && (*v)[*n - 1].last + 1 == cp && (*v)[*n - 1].category == category) {
        (*v)[*n - 1].last = cp;
        return;
    }
    tok_grow((void **)v, cap, *n + 1, sizeof **v);
    (*v)[(*n)++] = (struct cp_range){.first = cp, .last = cp, .category = category};
}

/* "15.0.0" as a number that orders versions: 15000000. */
static long unicode_version(const char *text)
{
    int major = 0, minor = 0, update = 0;
    sscanf(text, "%d.%d.%d", &major, &minor, &update);
    return major * 1000000L + minor * 1000L + update;
}

/* A code point's general category in Unicode 16: utf8proc's, or where it has
 * none (utf8proc older than 16), unicode_newer.h's. */
static int category_16(uint32_t cp)
{
    int category = utf8proc_category((utf8proc_int32_t)cp);
    if (category != UTF8PROC_CATEGORY_CN)
        return category;
    size_t lo = 0, hi = sizeof unicode_newer / sizeof *unicode_newer;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (cp > unicode_newer[mid].last)
            lo = mid + 1;
        else if (cp < unicode_newer[mid].first)
            hi = mid;
        else
            return (int)unicode_newer[mid].category;
    }
    return category;
}

/* Every code point Unicode 16 assigns (private use aside: stable since Unicode
 * 2), written back to back, searched once with PCRE2's \p{Cn}: about 150,000
 * code points, a few milliseconds. */
static void build_tables(void)
{
    /* With a PCRE2 as new as utf8proc and Unicode 16 (or newer), PCRE2's answers
     * stand: the others' unassigned code points would then take some PCRE2 knows. */
    char pcre2_version[24] = "";
    pcre2_config(PCRE2_CONFIG_UNICODE_VERSION, pcre2_version);
    long newest = unicode_version(utf8proc_unicode_version());
    if (unicode_version(UNICODE_NEWER_VERSION) > newest)
        newest = unicode_version(UNICODE_NEWER_VERSION);
    if (newest <= unicode_version(pcre2_version))
        return;
    size_t cap_newer = 0, cap_unassigned = 0;
    struct tok_bytes assigned = {0};
    for (uint32_t cp = 0; cp <= 0x10FFFF; cp++) {
        int category = category_16(cp);
        if (category == UTF8PROC_CATEGORY_CN)
            push_range(&tables.unassigned, &tables.n_unassigned, &cap_unassigned, cp, category);
        else if (category != UTF8PROC_CATEGORY_CS && category != UTF8PROC_CATEGORY_CO)
            assigned.len += tok_utf8_encode(cp, tok_bytes_reserve(&assigned, 4));
    }
    int code;
    PCRE2_SIZE at;
    pcre2_code *cn = pcre2_compile((PCRE2_SPTR) "\\p{Cn}", PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_UCP, &code, &at,
                                   NULL);
    pcre2_match_data *md = pcre2_match_data_create(1, NULL);
    if (!cn || !md)
        fail_internal("PCRE2 cannot compile \\p{Cn} (error %d)", code);
    pcre2_jit_compile(cn, PCRE2_JIT_COMPLETE);
    for (size_t pos = 0; pos < assigned.len;) {
        int rc = pcre2_match(cn, (PCRE2_SPTR)assigned.b, assigned.len, pos, PCRE2_NO_UTF_CHECK, md, NULL);
        if (rc < 0)
            break;
        size_t start = pcre2_get_ovector_pointer(md)[0];
        uint32_t cp = tok_utf8_decode(assigned.b + start);
        push_range(&tables.newer, &tables.n_newer, &cap_newer, cp, category_16(cp));
        pos = start + tok_utf8_len((unsigned char)assigned.b[start]);
    }
    pcre2_match_data_free(md);
    pcre2_code_free(cn);
    free(assigned.b);
}

static void append_str(struct tok_bytes *out, const char *s) { tok_bytes_append(out, s, strlen(s)); }

static void append_ranges(struct tok_bytes *out, const struct cp_range *v, size_t n, uint32_t cats)
{
    for (size_t k = 0; k < n; k++) {
        if (!(cats & (1u << v[k].category)))
            continue;
        char text[40];
        if (v[k].first == v[k].last)
            snprintf(text, sizeof text, "\\x{%X}", v[k].first);
        else
            snprintf(text, sizeof text, "\\x{%X}-\\x{%X}", v[k].first, v[k].last);
        append_str(out, text);
    }
}

static bool has_newer(uint32_t cats)
{
    for (size_t k = 0; k < tables.n_newer; k++)
        if (cats & (1u << tables.newer[k].category))
            return true;
    return false;
}

/* The members of a class (no brackets) that match the categories cats as
 * utf8proc has them where PCRE2 has no answer: `name` (a PCRE2 property whose
 * set is cats, or NULL) or the categories one by one, the newer code points
 * of those categories, and, for Cn, utf8proc's unassigned code points (PCRE2's
 * \p{Cn} would take the newer ones). */
static void append_members(struct tok_bytes *out, uint32_t cats, const char *name)
{
    uint32_t rest = cats & ~CAT(CN);
    if (name && !(cats & CAT(CN))) {
        append_str(out, "\\p{"), append_str(out, name), append_str(out, "}");
        rest = 0;
    }
    for (size_t g = 0; g < sizeof groups / sizeof *groups; g++)
        if ((rest & groups[g].cats) == groups[g].cats) {
            append_str(out, "\\p{"), append_str(out, groups[g].pcre2), append_str(out, "}");
            rest &= ~groups[g].cats;
        }
    for (int c = 0; c < (int)(sizeof category_names / sizeof *category_names); c++)
        if (rest & (1u << c))
            append_str(out, "\\p{"), append_str(out, category_names[c]), append_str(out, "}");
    append_ranges(out, tables.newer, tables.n_newer, cats);
    if (cats & CAT(CN))
        append_ranges(out, tables.unassigned, tables.n_unassigned, CAT(CN));
}

static const struct property *find_property(const char *name, size_t len)
{
    char key[64];
    size_t n = 0;
    for (size_t i = 0; i < len; i++) {
        char c = name[i];
        if (c == ' ' || c == '_' || c == '-')
            continue;
        if (n + 1 >= sizeof key)
            return NULL;
        key[n++] = (char)(c >= 'A' && c <= 'Z' ? c - 'A' + 'a' : c);
    }
    for (size_t k = 0; k < sizeof properties / sizeof *properties; k++)
        for (const char *s = properties[k].names; *s;) {
            size_t l = strcspn(s, "|");
            if (l == n && memcmp(s, key, n) == 0)
                return &properties[k];
            s += l + (s[l] == '|');
        }
    return NULL;
}

bool tok_unicode_property(struct tok_bytes *out, const char *name, size_t len, bool negated, bool in_class)
{
    const struct property *pr = find_property(name, len);
    if (!pr)
        return false;
    pthread_once(&tables_once, build_tables);
    bool changes = has_newer(pr->cats) || ((pr->cats & CAT(CN)) && tables.n_unassigned);
    if (!changes) { /* PCRE2's own answer is utf8proc's: only the name may need PCRE2's spelling */
        append_str(out, negated ? "\\P{" : "\\p{"), append_str(out, pr->pcre2), append_str(out, "}");
        return true;
    }
    if (negated && in_class) {
        /* a class cannot take a set away: the complement is spelled as the
         * categories outside this one; a property that is not a union of
         * categories keeps PCRE2's answer */
        if (!pr->category) {
            append_str(out, "\\P{"), append_str(out, pr->pcre2), append_str(out, "}");
            return true;
        }
        append_members(out, CATS_ALL & ~pr->cats, NULL);
        return true;
    }
    if (!in_class)
        append_str(out, negated ? "[^" : "[");
    append_members(out, pr->cats, pr->pcre2);
    if (!in_class)
        append_str(out, "]");
    return true;
}
