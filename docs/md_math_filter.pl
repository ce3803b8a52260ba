#!/usr/bin/perl
# Doxygen input filter for the chapter READMEs: GitHub writes math as $...$ and
# $$ ... $$, Doxygen as \f$...\f$ and \f[ ... \f]. Code blocks and `code spans`
# are left alone, so shell variables in examples stay as they are.
use strict;
use warnings;

my $in_fence = 0;
my $in_display = 0;
while (my $line = <>) {
  if ($line =~ /^\s*```/) {
    $in_fence = !$in_fence;
    print $line;
    next;
  }
  if ($in_fence) { print $line; next; }
  if ($line =~ /^\s*\$\$\s*$/) {          # a display block opens or closes on its own line
    print $in_display ? "\\f]\n" : "\\f[\n";
    $in_display = !$in_display;
    next;
  }
  if ($in_display) { print $line; next; }
  # Split on code spans; rewrite math only outside them.
  my @parts = split /(`[^`]*`)/, $line;
  for my $p (@parts) {
    next if $p =~ /^`/;
    $p =~ s/\$\$(.+?)\$\$/\\f[$1\\f]/g;
    $p =~ s/(?<![\\\w])\$([^\$\n]+?)\$(?!\w)/\\f\$$1\\f\$/g;
  }
  print join('', @parts);
}
