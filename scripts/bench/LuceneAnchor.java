// The Lucene anchor of `kart bench retriever`: Lucene (pyserini's engine) on the corpus and queries
// kart wrote, analysed and scored as kart's tantivy index is.
//
// Run as a single-file program (`java -cp <lucene-core, lucene-analysis-common, jackson-core>
// LuceneAnchor.java --corpus C --queries Q --topk K --threads T --work W --json OUT`; scripts/lucene.sh
// fetches the jars). Analysis: split on characters that are not letters or digits (tantivy's
// SimpleTokenizer), drop tokens of 40 or more characters, lower-case, Lucene's English stop words,
// Snowball's English (Porter2) stemmer: kart's `english_analyzer`. Scoring: BM25 with k1 = 1.2,
// b = 0.75 over one field holding the whole `contents`, with frequencies and no positions; the
// index sorted by corpus order (equal scores rank in corpus order, as in kart) and merged to one
// segment. A query is a disjunction of its distinct analysed terms. Measures, like kart:
// - index: reading and parsing the corpus, analysing and indexing on `--threads` threads, and the
//   merge to one segment (passages/s);
// - single: one query at a time on one thread (analysis, the top k with the block-max pruning that
//   a total-hits threshold of k allows, and reading the hits' stored id and contents), QPS and
//   p50/p99 latency;
// - concurrent: single queries from `--threads` client threads, QPS and p99;
// - recall@k: how often the query's known answer passage is among the top k.
// Every query's hits (id and score) go to `--work`/lucene-hits.txt, one line per query, for kart to
// compare with its own. Writes one JSON object to `--json`.

import com.fasterxml.jackson.core.JsonFactory;
import com.fasterxml.jackson.core.JsonGenerator;
import com.fasterxml.jackson.core.JsonParser;
import com.fasterxml.jackson.core.JsonToken;
import java.io.BufferedReader;
import java.io.BufferedWriter;
import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.HashMap;
import java.util.LinkedHashSet;
import java.util.List;
import java.util.Map;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;
import java.util.concurrent.atomic.AtomicInteger;
import org.apache.lucene.analysis.Analyzer;
import org.apache.lucene.analysis.TokenStream;
import org.apache.lucene.analysis.Tokenizer;
import org.apache.lucene.analysis.core.LowerCaseFilter;
import org.apache.lucene.analysis.core.StopFilter;
import org.apache.lucene.analysis.en.EnglishAnalyzer;
import org.apache.lucene.analysis.miscellaneous.LengthFilter;
import org.apache.lucene.analysis.snowball.SnowballFilter;
import org.apache.lucene.analysis.tokenattributes.CharTermAttribute;
import org.apache.lucene.analysis.util.CharTokenizer;
import org.apache.lucene.document.Document;
import org.apache.lucene.document.Field;
import org.apache.lucene.document.FieldType;
import org.apache.lucene.document.NumericDocValuesField;
import org.apache.lucene.document.StoredField;
import org.apache.lucene.document.StringField;
import org.apache.lucene.index.DirectoryReader;
import org.apache.lucene.index.IndexOptions;
import org.apache.lucene.index.IndexWriter;
import org.apache.lucene.index.IndexWriterConfig;
import org.apache.lucene.index.StoredFields;
import org.apache.lucene.index.Term;
import org.apache.lucene.search.BooleanClause;
import org.apache.lucene.search.BooleanQuery;
import org.apache.lucene.search.IndexSearcher;
import org.apache.lucene.search.ScoreDoc;
import org.apache.lucene.search.Sort;
import org.apache.lucene.search.SortField;
import org.apache.lucene.search.TermQuery;
import org.apache.lucene.search.TopDocs;
import org.apache.lucene.search.TopScoreDocCollector;
import org.apache.lucene.search.similarities.BM25Similarity;
import org.apache.lucene.store.MMapDirectory;
import org.tartarus.snowball.ext.EnglishStemmer;

public class LuceneAnchor {
  /** kart's MAX_TOKEN_BYTES: longer tokens are dropped (the words here are ASCII). */
  static final int MAX_TOKEN_CHARS = 40;

  static final BM25Similarity SIMILARITY = new BM25Similarity(1.2f, 0.75f);

  /** Letters and digits make tokens, like tantivy's SimpleTokenizer; no length split. */
  static final class AlphanumericTokenizer extends CharTokenizer {
    AlphanumericTokenizer() {
      super(DEFAULT_TOKEN_ATTRIBUTE_FACTORY, 1 << 20);
    }

    @Override
    protected boolean isTokenChar(int c) {
      return Character.isLetterOrDigit(c);
    }
  }

  /** kart's `english_analyzer`. */
  static final class KartAnalyzer extends Analyzer {
    @Override
    protected TokenStreamComponents createComponents(String field) {
      Tokenizer source = new AlphanumericTokenizer();
      TokenStream stream = new LengthFilter(source, 0, MAX_TOKEN_CHARS - 1);
      stream = new LowerCaseFilter(stream);
      stream = new StopFilter(stream, EnglishAnalyzer.ENGLISH_STOP_WORDS_SET);
      stream = new SnowballFilter(stream, new EnglishStemmer());
      return new TokenStreamComponents(source, stream);
    }
  }

  static final JsonFactory JSON = new JsonFactory();

  /** The string fields of one JSON object line. */
  static Map<String, String> strings(String line) throws IOException {
    Map<String, String> fields = new HashMap<>();
    try (JsonParser parser = JSON.createParser(line)) {
      if (parser.nextToken() != JsonToken.START_OBJECT) {
        throw new IOException("not a JSON object: " + line);
      }
      while (parser.nextToken() == JsonToken.FIELD_NAME) {
        String name = parser.currentName();
        JsonToken value = parser.nextToken();
        if (value.isScalarValue()) {
          fields.put(name, parser.getText());
        } else {
          parser.skipChildren();
        }
      }
    }
    return fields;
  }

  static Map<String, String> args(String[] argv) {
    Map<String, String> args = new HashMap<>();
    for (int i = 0; i + 1 < argv.length; i += 2) {
      if (!argv[i].startsWith("--")) {
        throw new IllegalArgumentException("expected --name value, got " + argv[i]);
      }
      args.put(argv[i].substring(2), argv[i + 1]);
    }
    for (String required : List.of("corpus", "queries", "topk", "threads", "work", "json")) {
      if (!args.containsKey(required)) {
        throw new IllegalArgumentException("--" + required + " is required");
      }
    }
    return args;
  }

  static void log(String message) {
    System.err.println("[lucene] " + message);
  }

  static final FieldType CONTENTS = new FieldType();

  static {
    CONTENTS.setTokenized(true);
    CONTENTS.setStored(true);
    CONTENTS.setIndexOptions(IndexOptions.DOCS_AND_FREQS);
    CONTENTS.freeze();
  }

  static Document document(String line, long ordinal) throws IOException {
    Map<String, String> row = strings(line);
    String id = row.get("id");
    String contents = row.get("contents");
    if (id == null || contents == null) {
      throw new IOException("corpus row " + ordinal + " lacks id or contents");
    }
    Document doc = new Document();
    doc.add(new StringField("id", id, Field.Store.YES));
    doc.add(new Field("contents", contents, CONTENTS));
    doc.add(new NumericDocValuesField("ordinal", ordinal));
    return doc;
  }

  /** Indexes the corpus into `dir` on `threads` threads; returns the number of passages. */
  static long index(Path corpus, Path dir, int threads) throws Exception {
    IndexWriterConfig config = new IndexWriterConfig(new KartAnalyzer());
    config.setSimilarity(SIMILARITY);
    config.setRAMBufferSizeMB(1024);
    config.setIndexSort(new Sort(new SortField("ordinal", SortField.Type.LONG)));
    config.setOpenMode(IndexWriterConfig.OpenMode.CREATE);
    ExecutorService pool = Executors.newFixedThreadPool(threads);
    long ordinal = 0;
    try (MMapDirectory directory = new MMapDirectory(dir);
        IndexWriter writer = new IndexWriter(directory, config);
        BufferedReader reader = Files.newBufferedReader(corpus, StandardCharsets.UTF_8)) {
      List<Future<?>> pending = new ArrayList<>();
      List<String> chunk = new ArrayList<>();
      String line;
      while (true) {
        line = reader.readLine();
        if (line != null && !line.isBlank()) {
          chunk.add(line);
        }
        if (chunk.size() == 2000 || (line == null && !chunk.isEmpty())) {
          final List<String> lines = chunk;
          final long first = ordinal;
          ordinal += lines.size();
          chunk = new ArrayList<>();
          pending.add(
              pool.submit(
                  () -> {
                    for (int i = 0; i < lines.size(); i++) {
                      writer.addDocument(document(lines.get(i), first + i));
                    }
                    return null;
                  }));
          // At most a few chunks in flight: the reader does not run ahead of the indexers.
          while (pending.size() > 2 * threads) {
            pending.remove(0).get();
          }
        }
        if (line == null) {
          break;
        }
      }
      for (Future<?> f : pending) {
        f.get();
      }
      writer.forceMerge(1);
      writer.commit();
    } finally {
      pool.shutdown();
    }
    return ordinal;
  }

  /** One query: its distinct analysed terms as a disjunction (null when it has none). */
  static BooleanQuery query(Analyzer analyzer, String text) throws IOException {
    LinkedHashSet<String> terms = new LinkedHashSet<>();
    try (TokenStream stream = analyzer.tokenStream("contents", text)) {
      CharTermAttribute term = stream.addAttribute(CharTermAttribute.class);
      stream.reset();
      while (stream.incrementToken()) {
        terms.add(term.toString());
      }
      stream.end();
    }
    if (terms.isEmpty()) {
      return null;
    }
    BooleanQuery.Builder builder = new BooleanQuery.Builder();
    for (String t : terms) {
      builder.add(new TermQuery(new Term("contents", t)), BooleanClause.Occur.SHOULD);
    }
    return builder.build();
  }

  /** A query's hits: ids and scores, with the stored contents read as a server reads them. */
  record Hits(String[] ids, float[] scores) {}

  static Hits search(IndexSearcher searcher, Analyzer analyzer, String text, int k) throws IOException {
    BooleanQuery query = query(analyzer, text);
    if (query == null) {
      return new Hits(new String[0], new float[0]);
    }
    TopDocs top = searcher.search(query, TopScoreDocCollector.createSharedManager(k, null, k));
    StoredFields stored = searcher.storedFields();
    String[] ids = new String[top.scoreDocs.length];
    float[] scores = new float[ids.length];
    for (int i = 0; i < ids.length; i++) {
      ScoreDoc hit = top.scoreDocs[i];
      Document doc = stored.document(hit.doc);
      if (doc.get("contents") == null) {
        throw new IOException("document " + hit.doc + " has no stored contents");
      }
      ids[i] = doc.get("id");
      scores[i] = hit.score;
    }
    return new Hits(ids, scores);
  }

  static double percentile(long[] nanos, double p) {
    long[] sorted = nanos.clone();
    Arrays.sort(sorted);
    double rank = p / 100.0 * (sorted.length - 1);
    int low = (int) Math.floor(rank);
    int high = (int) Math.ceil(rank);
    return (sorted[low] + (sorted[high] - sorted[low]) * (rank - low)) / 1e6;
  }

  public static void main(String[] argv) throws Exception {
    Map<String, String> args = args(argv);
    Path corpus = Path.of(args.get("corpus"));
    Path work = Path.of(args.get("work"));
    int k = Integer.parseInt(args.get("topk"));
    int threads = Integer.parseInt(args.get("threads"));
    Path dir = work.resolve("lucene-index");

    long started = System.nanoTime();
    long passages = index(corpus, dir, threads);
    double indexSeconds = (System.nanoTime() - started) / 1e9;
    log(String.format("indexed %d passages in %.1f s", passages, indexSeconds));
    long indexBytes = 0;
    try (var files = Files.list(dir)) {
      for (Path f : (Iterable<Path>) files::iterator) {
        indexBytes += Files.size(f);
      }
    }

    List<String> texts = new ArrayList<>();
    List<String> answers = new ArrayList<>();
    for (String line : Files.readAllLines(Path.of(args.get("queries")), StandardCharsets.UTF_8)) {
      if (!line.isBlank()) {
        Map<String, String> q = strings(line);
        texts.add(q.get("query"));
        answers.add(q.get("answer"));
      }
    }
    int n = texts.size();

    try (MMapDirectory directory = new MMapDirectory(dir);
        DirectoryReader reader = DirectoryReader.open(directory)) {
      IndexSearcher searcher = new IndexSearcher(reader);
      searcher.setSimilarity(SIMILARITY);
      Analyzer analyzer = new KartAnalyzer();

      // Warm-up: the JIT compiles the search path and the whole index is touched, twice over.
      for (int pass = 0; pass < 2; pass++) {
        for (String text : texts) {
          search(searcher, analyzer, text, k);
        }
      }

      long[] single = new long[n];
      Hits[] hits = new Hits[n];
      long singleStart = System.nanoTime();
      for (int i = 0; i < n; i++) {
        long began = System.nanoTime();
        hits[i] = search(searcher, analyzer, texts.get(i), k);
        single[i] = System.nanoTime() - began;
      }
      double singleSeconds = (System.nanoTime() - singleStart) / 1e9;

      long[] concurrent = new long[n];
      AtomicInteger next = new AtomicInteger();
      ExecutorService clients = Executors.newFixedThreadPool(threads);
      List<Future<?>> running = new ArrayList<>();
      long concurrentStart = System.nanoTime();
      for (int t = 0; t < threads; t++) {
        running.add(
            clients.submit(
                () -> {
                  Analyzer own = new KartAnalyzer();
                  for (int i; (i = next.getAndIncrement()) < n; ) {
                    long began = System.nanoTime();
                    search(searcher, own, texts.get(i), k);
                    concurrent[i] = System.nanoTime() - began;
                  }
                  return null;
                }));
      }
      for (Future<?> f : running) {
        f.get();
      }
      double concurrentSeconds = (System.nanoTime() - concurrentStart) / 1e9;
      clients.shutdown();

      int found = 0;
      try (BufferedWriter out = Files.newBufferedWriter(work.resolve("lucene-hits.txt"))) {
        for (int i = 0; i < n; i++) {
          StringBuilder line = new StringBuilder();
          for (int j = 0; j < hits[i].ids().length; j++) {
            line.append(j == 0 ? "" : " ").append(hits[i].ids()[j]).append(' ').append(hits[i].scores()[j]);
            if (hits[i].ids()[j].equals(answers.get(i))) {
              found++;
            }
          }
          out.write(line.append('\n').toString());
        }
      }

      try (JsonGenerator json = JSON.createGenerator(Files.newBufferedWriter(Path.of(args.get("json"))))) {
        json.useDefaultPrettyPrinter();
        json.writeStartObject();
        json.writeStringField(
            "anchor",
            String.format(
                "Lucene %s (BM25Similarity, TopScoreDocCollector pruning), Java %s, %d threads",
                org.apache.lucene.util.Version.LATEST,
                Runtime.version().feature(),
                threads));
        json.writeNumberField("passages", passages);
        json.writeNumberField("queries", n);
        json.writeNumberField("index_seconds", indexSeconds);
        json.writeNumberField("index_passages_per_second", passages / indexSeconds);
        json.writeNumberField("index_bytes", indexBytes);
        json.writeNumberField("single_qps", n / singleSeconds);
        json.writeNumberField("single_p50_ms", percentile(single, 50));
        json.writeNumberField("single_p99_ms", percentile(single, 99));
        json.writeNumberField("concurrent_qps", n / concurrentSeconds);
        json.writeNumberField("concurrent_p99_ms", percentile(concurrent, 99));
        json.writeNumberField("recall", (double) found / n);
        json.writeStringField("hits", work.resolve("lucene-hits.txt").toString());
        json.writeEndObject();
      }
    }
  }
}
