#!/usr/bin/perl
# Doxygen input filter for the Markdown pages (chapter READMEs and the generated
# pages of the study site).
#
#   perl md_math_filter.pl [APPEND_DIR] FILE
#
# 1. Math: GitHub writes $...$ and $$ ... $$, Doxygen \f$...\f$ and \f[ ... \f].
#    Code blocks, `code spans` and \htmlonly blocks are left alone, so shell
#    variables in examples stay as they are.
# 2. A chapter README (chapters/NN_name/README.md, or the page docs/site.py
#    assembles from a chapter's parts, chNN_sections.md) gets the label chNN on its
#    first heading, so that other pages can \ref it, and the generated section
#    APPEND_DIR/chNN.md (its figures and step diffs) is inserted before its
#    "## Exercises" heading (or at the end when it has none).
use strict;
use warnings;

my $append_dir = @ARGV > 1 ? shift @ARGV : '';
my $file = $ARGV[0] // '';
my ($chapter) = $file =~ m{chapters/(\d\d)_[^/]+/README\.md$};
($chapter) = $file =~ m{/ch(\d\d)_sections\.md$} unless defined $chapter;   # a chapter assembled from its parts
my $append = '';
if (defined $chapter && $append_dir ne '' && -f "$append_dir/ch$chapter.md") {
  open(my $fh, '<', "$append_dir/ch$chapter.md") or die "$append_dir/ch$chapter.md: $!";
  local $/;
  $append = <$fh>;
  close $fh;
}

# Pictures anchored to a section: "<!-- at: REGEX -->" ... "<!-- end -->" blocks go at the
# end of the first section whose heading matches REGEX; the others replace
# "<!-- pictures-left -->" under a "Pictures" heading.
my @anchored;
while ($append =~ s/<!-- at: (.*?) -->\n(.*?)<!-- end -->\n?//s) { push @anchored, [qr/$1/, $2, 0]; }
my @pending;
sub flush_pending { my ($out) = @_; push @$out, "\n", $_->[1] for @pending; @pending = (); }

my $in_fence = 0;
my $in_display = 0;
my $in_html = 0;
my $labelled = 0;
my @out;
my $inserted = 0;
while (my $line = <>) {
  if (!$in_fence && !$in_display && $line =~ /^\\htmlonly\b/) { $in_html = 1; }
  if ($in_html) {
    push @out, $line;
    $in_html = 0 if $line =~ /\\endhtmlonly/;
    next;
  }
  if ($line =~ /^\s*```/) {
    $in_fence = !$in_fence;
    push @out, $line;
    next;
  }
  if ($in_fence) { push @out, $line; next; }
  if (@anchored && $line =~ /^#{1,6} /) {
    flush_pending(\@out);
    for my $a (@anchored) {
      if (!$a->[2] && $line =~ $a->[0]) { $a->[2] = 1; push @pending, $a; }
    }
  }
  if (defined $chapter && !$labelled && $line =~ /^# /) {
    chomp $line;
    $line =~ s/\s*\{#[^}]*\}\s*$//;
    $line .= " {#ch$chapter}\n";
    $labelled = 1;
  }
  if ($append ne '' && !$inserted && $line =~ /^## Exercises\b/) {
    push @out, left_append(), "\n";
    $inserted = 1;
  }
  if ($line =~ /^\s*\$\$\s*$/) {          # a display block opens or closes on its own line
    push @out, $in_display ? "\\f]\n" : "\\f[\n";
    $in_display = !$in_display;
    next;
  }
  if ($in_display && $line !~ /\$\$/) { push @out, $line; next; }
  # Split on code spans; rewrite math only outside them. A $$ that opens a display on one
  # line and closes it on a later one toggles the display state.
  my @parts = split /(`[^`]*`)/, $line;
  for my $p (@parts) {
    next if $p =~ /^`/ && !$in_display;
    my $done = '';
    while ($p =~ /\$\$/) {
      my ($before, $after) = split /\$\$/, $p, 2;
      $before = inline_math($before) unless $in_display;
      $done .= $before . ($in_display ? '\\f]' : '\\f[');
      $in_display = !$in_display;
      $p = $after;
    }
    $p = $done . ($in_display ? $p : inline_math($p));
  }
  push @out, join('', @parts);
}
flush_pending(\@out);
push @out, "\n", left_append() if $append ne '' && !$inserted;
print @out;

sub left_append {
  my @left = grep { !$_->[2] } @anchored;
  my $pics = @left ? "## Pictures\n\n" . join("\n", map { $_->[1] } @left) . "\n" : '';
  $_->[2] = 1 for @left;
  (my $a = $append) =~ s/<!-- pictures-left -->\n?/$pics/;
  return $a;
}

sub inline_math {
  my ($t) = @_;
  $t =~ s/(?<![\\\w])\$([^\$\n]+?)\$(?!\w)/\\f\$$1\\f\$/g;
  return $t;
}
