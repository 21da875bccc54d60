"""Prepaid credits: grants (never changed, audited) and each balance's last checkpoint.

Revision ID: 0006_credits
Revises: 0005_networks
Create Date: 2026-12-04 12:00:00

New tables only: existing rows are untouched, and no caller has credits until an
operator grants some (flask quota credits grant, quota.grant, the dashboard).
"""
from alembic import op
import sqlalchemy as sa


revision = '0006_credits'
down_revision = '0005_networks'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        'quota_credit_grants',
        sa.Column('id', sa.Integer(), nullable=False),
        sa.Column('caller', sa.String(length=200), nullable=False),
        sa.Column('resource', sa.String(length=64), nullable=False),
        sa.Column('units', sa.BigInteger(), nullable=False),
        sa.Column('expires_at', sa.DateTime(timezone=True), nullable=True),
        sa.Column('note', sa.String(length=500), nullable=False),
        sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
        sa.Column('created_by', sa.String(length=200), nullable=False),
        sa.CheckConstraint('units >= 1', name=op.f('ck_quota_credit_grants_units')),
        sa.PrimaryKeyConstraint('id', name=op.f('pk_quota_credit_grants')),
    )
    op.create_index(
        op.f('ix_quota_credit_grants_caller_resource'),
        'quota_credit_grants', ['caller', 'resource'], unique=False,
    )
    op.create_index(
        op.f('ix_quota_credit_grants_created_at'),
        'quota_credit_grants', ['created_at'], unique=False,
    )
    op.create_table(
        'quota_credit_balances',
        sa.Column('id', sa.Integer(), nullable=False),
        sa.Column('caller', sa.String(length=200), nullable=False),
        sa.Column('resource', sa.String(length=64), nullable=False),
        sa.Column('state', sa.Text(), nullable=False),
        sa.Column('version', sa.BigInteger(), nullable=False),
        sa.Column('updated_at', sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint('id', name=op.f('pk_quota_credit_balances')),
        sa.UniqueConstraint(
            'caller', 'resource', name=op.f('uq_quota_credit_balances_caller_resource')
        ),
    )


def downgrade() -> None:
    op.drop_table('quota_credit_balances')
    op.drop_index(op.f('ix_quota_credit_grants_created_at'), table_name='quota_credit_grants')
    op.drop_index(
        op.f('ix_quota_credit_grants_caller_resource'), table_name='quota_credit_grants'
    )
    op.drop_table('quota_credit_grants')
